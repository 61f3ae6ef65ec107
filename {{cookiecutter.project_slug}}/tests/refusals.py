"""Runs the training command once per case, all in this one process: `python -m refusals CASES.json`, where
CASES.json is a list of argument lists (`env:NAME=VALUE` items set the environment of that case). Input the
training must refuse is refused before any training, so one start-up of torch serves every case (a process per
case costs seconds of CI time each). Each case's output follows a `=== case N` line and ends with a `=== exit CODE`
line."""

import json
import os
import sys
from pathlib import Path

from engine_specific import reset_engine_state
from hydra.core.global_hydra import GlobalHydra

from {{ cookiecutter.package_name }}.train import main

ENV = "env:"  # a case's `env:NAME=VALUE` items set NAME in its environment (e.g. env:WORLD_SIZE=2: a launcher's 2)


def run(argv: list[str]) -> int:
    env = dict(item.removeprefix(ENV).split("=", 1) for item in argv if item.startswith(ENV))
    sys.argv = ["{{ cookiecutter.package_name }}.train", *(item for item in argv if not item.startswith(ENV))]
    os.environ.update(env)
    try:
        main()
        return 0
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else 1
    finally:
        for name in env:
            del os.environ[name]
        GlobalHydra.instance().clear()
        reset_engine_state()  # the next case builds its own


if __name__ == "__main__":
    for index, argv in enumerate(json.loads(Path(sys.argv[1]).read_text())):
        print(f"=== case {index}", flush=True)
        code = run(argv)
        print(f"=== exit {code}", flush=True)
