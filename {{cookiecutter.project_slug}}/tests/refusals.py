"""Runs the training command once per case, all in this one process: `python refusals.py CASES.json`, where
CASES.json is a list of argument lists. Input the training must refuse is refused before any training, so one
start-up of torch serves every case (a process per case costs seconds of CI time each). Each case's output
follows a `=== case N` line and ends with a `=== exit CODE` line."""

import json
import sys
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra

from {{ cookiecutter.package_name }}.train import main


def run(argv: list[str]) -> int:
    sys.argv = ["{{ cookiecutter.package_name }}.train", *argv]
    try:
        main()
        return 0
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else 1
    finally:
        GlobalHydra.instance().clear()
{%- if cookiecutter.engine == "accelerate" %}
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)  # the next case builds its own
{%- endif %}


if __name__ == "__main__":
    for index, argv in enumerate(json.loads(Path(sys.argv[1]).read_text())):
        print(f"=== case {index}", flush=True)
        code = run(argv)
        print(f"=== exit {code}", flush=True)
