"""Timestamps of every training iteration, recorded the same way in both runs being compared.

`StepTimer` is a Lightning callback added to the baked project's training with
`+callbacks.step_timer._target_=step_timer.StepTimer`. The Accelerate engine's loop has no callbacks:
`timed_net` (`model.net._target_=step_timer.timed_net`) builds the project's net with a hook that
records the start of every training forward. `Recorder` serves the plain loops.
An iteration is the time between two consecutive batch starts: data loading, forward,
backward, optimizer step and whatever the framework does around them. Each start records the wall clock and
the process's CPU time (all its threads): CPU time per step moves much less than wall time when other jobs
share the machine. With $BENCH_PROFILE set (`FILE:FIRST:STEPS`, by calls.py), the Recorder also runs cProfile over
STEPS whole iterations from the FIRST-th batch start on and saves it to FILE (rank 0).
"""

import atexit
import cProfile
import importlib
import json
import os
import resource
import time

import lightning as L
from torch import nn


def rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


class Recorder:
    def __init__(self) -> None:
        self.starts: list[float] = []
        self.cpu: list[float] = []
        self.epochs: list[int] = []
        self.profile_to, first, steps = os.environ.get("BENCH_PROFILE", "::").split(":")
        self.window = (int(first), int(first) + int(steps)) if self.profile_to else ()
        self.profiler = cProfile.Profile()

    def batch_start(self, epoch: int) -> None:
        self.starts.append(time.time())
        self.cpu.append(time.process_time())
        self.epochs.append(epoch)
        if len(self.starts) in self.window:  # last: the window covers whole iterations
            self._toggle_profiler()

    def _toggle_profiler(self) -> None:
        if len(self.starts) == self.window[0]:
            self.profiler.enable()
            return
        self.profiler.disable()
        if rank() == 0:
            self.profiler.dump_stats(self.profile_to)

    def save(self) -> None:
        """Write to $BENCH_OUT (rank 0 only); the launcher's clock gives start-up time."""
        if rank() != 0:
            return
        result = {
            "launch": float(os.environ["BENCH_LAUNCH"]),
            "starts": self.starts,
            "cpu": self.cpu,
            "epochs": self.epochs,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        with open(os.environ["BENCH_OUT"], "w") as f:
            json.dump(result, f)


class StepTimer(L.Callback):
    def __init__(self) -> None:
        self.recorder = Recorder()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.recorder.batch_start(trainer.current_epoch)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self.recorder.save()


RECORDER = Recorder()  # timed_net's; saved when the process exits, if it trained (train.py may build two nets)
atexit.register(lambda: RECORDER.starts and RECORDER.save())


def timed_net(**settings) -> nn.Module:
    """The baked project's ResidualMLP ($BENCH_PACKAGE), recording each training forward's start. A forward in
    eval mode (validation) ends the epoch: the next training forward starts the next one."""
    net = importlib.import_module(f"{os.environ['BENCH_PACKAGE']}.models.mlp").ResidualMLP(**settings)
    epoch, evaluated = 0, False

    def record(module: nn.Module, args: tuple) -> None:
        nonlocal epoch, evaluated
        if not module.training:
            evaluated = True
            return
        if evaluated:
            epoch, evaluated = epoch + 1, False
        RECORDER.batch_start(epoch)

    net.register_forward_pre_hook(record)
    return net
