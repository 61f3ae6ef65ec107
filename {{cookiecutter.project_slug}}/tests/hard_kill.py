"""A net that kills its whole training at once, as a node failure or the kernel's OOM killer does: wandb's own
process first stops writing (frozen with SIGSTOP, so that the steps it has not written yet are surely lost, as a
real kill loses about a second of them), then the training and wandb's process are SIGKILLed right after a
checkpoint. Only once: it leaves `marker`, so the same command run again trains through."""

import os
import signal
from pathlib import Path

import torch

from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP


class HardKilledOnce(ResidualMLP):
    """Freezes wandb's process in the forward of training step `freeze_wandb_at` (0-based) and kills the job in
    the forward of step `kill_at`: with a checkpoint every 3 steps, right after the checkpoint of 6 steps."""

    def __init__(self, *args, marker: str, freeze_wandb_at: int = 2, kill_at: int = 6, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker, self.freeze_wandb_at, self.kill_at, self.calls = Path(marker), freeze_wandb_at, kill_at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not self.marker.exists():
            if self.calls == self.freeze_wandb_at:
                signal_all(wandb_processes(), signal.SIGSTOP)
            if self.calls == self.kill_at:
                self.marker.touch()
                signal_all([*wandb_processes(), os.getpid()], signal.SIGKILL)
            self.calls += 1
        return super().forward(x)


def wandb_processes() -> list[int]:
    """wandb's service processes started by this one (its children, whose command line names wandb)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and b"wandb" in command:
            found.append(int(stat.parent.name))
    assert found, "no wandb process to freeze: the test would prove nothing"
    return found


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        os.kill(pid, signum)
