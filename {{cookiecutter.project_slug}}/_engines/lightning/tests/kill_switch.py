"""Test-only ways for a training to die for real: SIGKILL after a step, or in the middle of writing a checkpoint,
or stall until a test kills it.

Each fires once per training: it leaves a marker file first, so the restarted training (torchrun restart, SLURM
requeue, the same command again) runs through. Before a kill, each waits out wandb's one-second flush of its run
file (tracking.resumed_wandb_run): a kill loses up to a second of metrics, more than these tiny steps take.
"""

import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

WANDB_FLUSH_SECONDS = 2


def die_once(marker: str | Path) -> None:
    marker = Path(marker)
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    time.sleep(WANDB_FLUSH_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)


class KillAtStep(L.Callback):
    """SIGKILL process `rank` once, right after optimizer step `step` (and any checkpoint of that step)."""

    def __init__(self, step: int, marker: str, rank: int = 0) -> None:
        self.step, self.marker, self.rank = step, marker, rank

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            die_once(self.marker)


class KillAfterTheSave(ModelCheckpoint):
    """SIGKILL process 0 once, after optimizer step `step` and its checkpoint, before Lightning logs the step: a
    ModelCheckpoint that saves nothing, since Lightning runs those after the other callbacks, in their order (this one
    after the template's)."""

    def __init__(self, step: int, marker: str) -> None:
        super().__init__(save_top_k=0)
        self.step, self.marker = step, marker

    @property
    def state_key(self) -> str:
        return "KillAfterTheSave"

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            die_once(self.marker)


class StallAtStep(L.Callback):
    """Process 0 stops for good right after optimizer step `step`, once (it leaves `marker`, which also tells the
    test it got there), until something kills the job: a test's `scontrol requeue`, standing for a pre-emption."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0 and not self.marker.exists():
            self.marker.touch()
            while True:
                time.sleep(1)


class DyingCheckpointIO(TorchCheckpointIO):
    """Writes checkpoints like Lightning, except the one of step `step`: half of it goes straight to its final
    path, then the process is SIGKILLed (what a kill during a copy across filesystems leaves behind)."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, marker

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if checkpoint.get("global_step") != self.step or Path(self.marker).exists():
            return super().save_checkpoint(checkpoint, path, storage_options)
        tmp = Path(path).with_suffix(".whole")
        torch.save(checkpoint, tmp)
        data = tmp.read_bytes()
        tmp.unlink()
        with open(path, "wb") as file:
            file.write(data[: len(data) // 2])
        die_once(self.marker)
