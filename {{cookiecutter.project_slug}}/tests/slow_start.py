"""A torchrun worker slow to start (its imports take seconds on a busy machine): `python -m slow_start MODULE ARGS`
imports the package, waits until `<marker>.go` exists (having left `<marker>.paused`, marker: $SLOW_START_MARKER),
then runs MODULE as `python -m MODULE ARGS` would."""

import os
import runpy
import sys
import time
from pathlib import Path

import {{ cookiecutter.package_name }}  # noqa: F401  (the package reads first thing which process started it)

marker = os.environ["SLOW_START_MARKER"]
Path(f"{marker}.paused").write_text(str(os.getpid()))
for _ in range(1200):  # at most a minute
    if Path(f"{marker}.go").exists():
        break
    time.sleep(0.05)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
