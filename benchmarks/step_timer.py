"""Timestamps of every training iteration, recorded the same way in both runs being compared.

`StepTimer` is a Lightning callback added to the baked project's training with
`+callbacks.step_timer._target_=step_timer.StepTimer`; `record` serves the plain loops.
An iteration is the time between two consecutive batch starts: data loading, forward,
backward, optimizer step and whatever the framework does around them.
"""

import json
import os
import resource
import time

import lightning as L


class Recorder:
    def __init__(self) -> None:
        self.starts: list[float] = []
        self.epochs: list[int] = []

    def batch_start(self, epoch: int) -> None:
        self.starts.append(time.time())
        self.epochs.append(epoch)

    def save(self) -> None:
        """Write to $BENCH_OUT (rank 0 only); the launcher's clock gives start-up time."""
        if int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) != 0:
            return
        result = {
            "launch": float(os.environ["BENCH_LAUNCH"]),
            "starts": self.starts,
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
