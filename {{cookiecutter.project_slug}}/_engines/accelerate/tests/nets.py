"""Test-only nets, selected with model.net._target_=nets.<Name> (the tests folder is on the trainings' path)."""

import os

import torch

from {{ cookiecutter.package_name }}.model import ResidualMLP


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
    """Runs out of memory (torch.OutOfMemoryError, as CUDA raises it) on batches larger than `max_batch`,
    on the process of rank `oom_rank` only: the other processes would happily train with the larger batch."""

    def __init__(self, *args, max_batch: int = 40, oom_rank: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_batch, self.oom_rank = max_batch, oom_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) > self.max_batch and int(os.environ.get("RANK", 0)) == self.oom_rank:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(x)
