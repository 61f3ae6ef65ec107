"""Test-only nets (model.net._target_=nets.<Name>) and optimizers (model.optimizer._target_=nets.<Name>); the
tests folder is on the trainings' path."""

import os
import signal
import time
from pathlib import Path

import torch
from simulated_oom import OOMInBackward, simulated_oom

from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP

WANDB_FLUSH_SECONDS = 2


class FailingNet(ResidualMLP):
    """Raises in its forward of training step `fail_at`: a crash in the middle of training."""

    def __init__(self, *args, fail_at: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_at, self.calls = fail_at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        if self.calls > self.fail_at:
            raise RuntimeError("FailingNet: simulated crash")
        return super().forward(x)


class OOMNet(ResidualMLP):
    """Runs out of memory (torch.OutOfMemoryError, as CUDA raises it) on training batches larger than `max_batch`, in
    the forward (or in the backward: `in_backward`), on the process of rank `oom_rank` only: the other processes
    would happily train with the larger batch. `noise`: adds that much random noise to the inputs, drawn after
    any forward OOM (a step's random numbers, as dropout's)."""

    def __init__(
        self, *args, max_batch: int = 40, oom_rank: int = 0, in_backward: bool = False, noise: float = 0.0, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_batch, self.oom_rank, self.in_backward, self.noise = max_batch, oom_rank, in_backward, noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (training batches only: an evaluation keeps no activations for a backward, and the recovery is the steps')
        oom = self.training and len(x) > self.max_batch and int(os.environ.get("RANK", 0)) == self.oom_rank
        if oom and not self.in_backward:
            raise simulated_oom()
        if self.noise:
            x = x + self.noise * torch.randn_like(x)
        out = super().forward(x)
        return OOMInBackward.apply(out) if oom else out


class KilledOnce(ResidualMLP):
    """SIGKILLs its own process in the forward of training step `kill_at` (0-based), on the process of rank
    `rank`, as a crashed machine or the kernel's OOM killer would: no cleanup, no exception. Only once: it leaves
    the file `marker` behind, so the restarted (or re-run) training goes through."""

    def __init__(self, *args, kill_at: int = 3, rank: int = 0, marker: str = "killed", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kill_at, self.rank, self.marker, self.calls = kill_at, rank, Path(marker), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        if self.calls == self.kill_at + 1 and int(os.environ.get("RANK", 0)) == self.rank:
            kill_once(self.marker)
        return super().forward(x)


class StalledOnce(ResidualMLP):
    """Stops in the forward of training step `stall_at` (0-based), on the process of rank 0, until something
    kills the job (a test's `scontrol requeue`, standing for a pre-emption). Only once: it leaves `marker` behind,
    which also tells the test that the job has got that far."""

    def __init__(self, *args, stall_at: int = 3, marker: str = "stalled", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stall_at, self.marker, self.calls = stall_at, Path(marker), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.training
        if self.calls == self.stall_at + 1 and int(os.environ.get("RANK", 0)) == 0 and not self.marker.exists():
            self.marker.touch()
            time.sleep(600)
        return super().forward(x)


class AdamWKilledWhileSaving(torch.optim.AdamW):
    """AdamW whose process is SIGKILLed while the checkpoint of optimizer step `kill_at_step` is written, after
    the net's weights and before the optimizer's state: a half-written checkpoint. Once, like KilledOnce."""

    def __init__(self, *args, kill_at_step: int = 6, marker: str = "killed", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kill_at_step, self.marker = kill_at_step, Path(marker)

    def state_dict(self) -> dict:
        steps = [int(state["step"]) for state in self.state.values()]
        if steps and steps[0] == self.kill_at_step:
            kill_once(self.marker)
        return super().state_dict()


def kill_once(marker: Path) -> None:
    """SIGKILL this process, unless `marker` says it happened before. It first waits out wandb's one-second
    flush of its run file (tracking.resumed_wandb_run): a kill loses up to a second of metrics, more than the
    tests' tiny steps take."""
    if not marker.exists():
        marker.touch()
        time.sleep(WANDB_FLUSH_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)
