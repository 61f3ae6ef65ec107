"""Simulated out-of-memory errors for the OOM toolkit tests: deterministic, on CPU.

Used inside training subprocesses (`+model._target_=oom_sim.OOMClassifier`), so the tests folder is put
on their PYTHONPATH.
"""

import torch
from simulated_oom import OOMInBackward, simulated_oom

from {{ cookiecutter.package_name }}.engine.module import Classifier


class OOMClassifier(Classifier):
    """Raises a simulated CUDA OOM on rank `oom_rank` (every rank if None): in the forward of any batch larger
    than `oom_above`, in the backward of any batch larger than `oom_in_backward_above`, for the whole batch (not
    its micro-batches) at the batch indices in `oom_batches`, and for (micro-)batches larger than
    `oom_limits[batch_idx]` at those batch indices. `noise`: adds that much random noise to the inputs, drawn
    after any forward OOM (a step's random numbers, as dropout's)."""

    def __init__(
        self,
        *args,
        oom_above: int | None = None,
        oom_in_backward_above: int | None = None,
        oom_batches=(),
        oom_limits=None,
        oom_rank: int | None = None,
        noise: float = 0.0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.oom_above, self.oom_batches, self.oom_rank = oom_above, list(oom_batches), oom_rank
        self.oom_in_backward_above, self.oom_limits = oom_in_backward_above, dict(oom_limits or {})
        self.noise = noise

    def training_step(self, batch, batch_idx):
        size = len(batch[0])
        mine = self.oom_rank is None or self.global_rank == self.oom_rank
        if mine:
            if self.oom_above is not None and size > self.oom_above:
                raise simulated_oom()
            whole_batch = size == self.trainer.datamodule.per_device_batch_size
            if self.trainer.training and batch_idx in self.oom_batches and whole_batch:
                raise simulated_oom()
            if size > self.oom_limits.get(batch_idx, size):
                raise simulated_oom()
        if self.noise:
            batch = (batch[0] + self.noise * torch.randn_like(batch[0]), batch[1])
        loss = super().training_step(batch, batch_idx)
        if mine and self.oom_in_backward_above is not None and size > self.oom_in_backward_above:
            loss = OOMInBackward.apply(loss)
        return loss
