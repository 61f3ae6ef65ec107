"""The training command with a clock on it: `python -m {{ cookiecutter.package_name }}.steptimes [train overrides]`.

Runs `{{ cookiecutter.package_name }}.train` unchanged and, on global rank 0, writes $STEP_TIMES_FILE (JSON) when
the process exits: the time each optimizer step ended (`torch.optim`'s global step hook, so it counts the steps
of either engine and every preset without touching the training code) and, under strategy=pipeline, each step's
measured per-stage idle share. `bench scaling` runs each point through it. A launcher that re-runs this module
for the other ranks (Lightning's ddp, torchrun, accelerate launch) passes the environment on, so every rank
installs the hook; only rank 0 writes.
"""

import atexit
import json
import os
import runpy
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import pipelining

ENV = "STEP_TIMES_FILE"


class StepClock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.step_ends: list[float] = []
        self.idle_fractions: list[list[float]] = []
        self.rank: int | None = None

    def on_step(self, *_: Any) -> None:
        now = time.perf_counter()
        if self.rank is None:  # the process group exists by the first step; it may be gone at exit
            self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.step_ends.append(now)  # the models here have one optimizer: one call per training step

    def save(self) -> None:
        if self.rank == 0 and self.step_ends:
            record = {"step_ends": self.step_ends, "idle_fractions": self.idle_fractions}
            self.path.write_text(json.dumps(record))


def install(path: Path) -> StepClock:
    clock = StepClock(path)
    register_optimizer_step_post_hook(clock.on_step)
    pipeline_step = pipelining.Pipeline.train_step

    def train_step(self: pipelining.Pipeline, x: Any, y: Any, measure: bool = True) -> Any:
        loss, idle = pipeline_step(self, x, y, measure=True)  # every step's idle share, not only logged steps'
        clock.idle_fractions.append(idle)
        return loss, idle

    pipelining.Pipeline.train_step = train_step
    atexit.register(clock.save)
    return clock


def main() -> None:
    if ENV in os.environ:
        install(Path(os.environ[ENV]))
    # As `python -m ...train` runs it (Hydra finds the configs next to the file of a __main__ module); this
    # module stays __main__, so launchers that re-run __main__ for the other ranks re-run the clock too.
    runpy.run_module(f"{__package__}.train", run_name="__main__")


if __name__ == "__main__":
    main()
