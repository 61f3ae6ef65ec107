"""The training command with a clock on it: `python -m {{ cookiecutter.package_name }}.tools.steptimes [train overrides]`.

Runs `{{ cookiecutter.package_name }}.train` unchanged and, on global rank 0, writes $STEP_TIMES_FILE (JSON) once
$STEP_TIMES_STEPS optimizer steps have ended: the time each step ended (`torch.optim`'s global step hook, so it
counts the steps of either engine and every preset without touching the training code), the peak memory (the GPU's
allocated bytes, or the process's resident memory on a CPU), under strategy=pipeline each step's measured per-stage
idle share, and the largest batch the batch-size finder found when it ran (its trial steps are not counted).
`bench scaling` and `bench memory` run each point through it.

Every training process must have the clock. A launcher that re-runs this module (Lightning's ddp, torchrun,
accelerate launch) runs main() again; strategy=ddp_spawn's processes (Lightning: spawned, they import this module
as `__mp_main__`; Accelerate: forked, they inherit the clock) do not. The file is written at the last step, not at
exit: a forked process ends with os._exit, which runs no exit handlers.
"""

import json
import os
import resource
import runpy
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..parallel import pipelining
from ..parallel.launcher import PACKAGE
from ..runtime import memory

ENV = "STEP_TIMES_FILE"
STEPS_ENV = "STEP_TIMES_STEPS"
WARMUP_ENV = "STEP_TIMES_WARMUP"


def progress_file(times_file: Path) -> Path:
    """Where the clock counts the steps that have ended, step by step."""
    return times_file.with_suffix(".progress")


class StepClock:
    def __init__(self, path: Path, steps: int, warmup: int = 0) -> None:
        self.path, self.steps = path, steps
        # The timed window's two ends wait for the GPU's queued work (a step's end on the host is only its launch);
        # the steps between do not, as a training does not.
        self.synchronised = {warmup, steps}
        self.progress = progress_file(path)
        self.step_ends: list[float] = []
        self.idle_fractions: list[list[float]] = []
        self.largest_batch: int | None = None
        self.rank: int | None = None

    def searched(self, largest: int) -> None:
        """The batch-size finder's result; the clock and the memory peak start again with the training after it."""
        self.largest_batch = largest
        self.step_ends.clear()
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def on_step(self, *_: Any) -> None:
        if len(self.step_ends) + 1 in self.synchronised and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self.rank is None:  # the process group exists by the first step
            self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.step_ends.append(now)  # the models here have one optimizer: one call per training step
        if self.rank == 0:  # how far it got, should the bench stop it for running too long (a few µs a step)
            self.progress.write_text(str(len(self.step_ends)))
        if len(self.step_ends) == self.steps and self.rank == 0:  # after the last timed moment
            record = {
                "step_ends": self.step_ends, "idle_fractions": self.idle_fractions,
                "peak_memory_mib": peak_memory_mib(), "largest_batch": self.largest_batch,
            }  # fmt: skip
            self.path.write_text(json.dumps(record))


def peak_memory_mib() -> float:
    """This process's peak: on its GPU the tensors' allocated bytes (torch's caching allocator), on a CPU the
    resident memory (which includes the interpreter and the libraries)."""
    if torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


def install() -> StepClock:
    """The clock, on every optimizer step of this process and of the processes it forks."""
    clock = StepClock(Path(os.environ[ENV]), int(os.environ[STEPS_ENV]), int(os.environ.get(WARMUP_ENV, 0)))
    register_optimizer_step_post_hook(clock.on_step)
    search = memory.search  # both engines' finders call it through its module

    def recorded_search(*args: Any, **kwargs: Any) -> tuple[int, int]:
        largest, trials = search(*args, **kwargs)
        clock.searched(largest)
        return largest, trials

    memory.search = recorded_search
    pipeline_step = pipelining.Pipeline.train_step

    def train_step(self: pipelining.Pipeline, x: Any, y: Any, measure: bool = True) -> Any:
        loss, idle = pipeline_step(self, x, y, measure=True)  # every step's idle share, not only logged steps'
        clock.idle_fractions.append(idle)
        return loss, idle

    pipelining.Pipeline.train_step = train_step
    return clock


def main() -> None:
    if ENV in os.environ:
        install()
    # As `python -m ...train` runs it (Hydra finds the configs next to the file of a __main__ module); this
    # module stays __main__, so launchers that re-run __main__ for the other ranks re-run the clock too.
    runpy.run_module(f"{PACKAGE}.train", run_name="__main__")


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__" and ENV in os.environ:  # a process torch.multiprocessing spawned (ddp_spawn)
    install()
