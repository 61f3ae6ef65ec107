"""The training loss of a global batch that holds padding targets (-100: a collate's padded tokens, unlabelled
samples): the mean over all of the batch's real targets, as one device computes it, under every preset.

Each preset splits the global batch into chunks (the processes' shares, accumulated micro-batches, the OOM recovery's
micro-batches, a pipeline's micro-batches) and averages the chunks' mean losses weighted by their samples. A chunk
with more padding then counted as much as one without: under ddp, the loss of padded token batches was 1.4e-2 off
the single-device run's. Here each chunk's mean is weighted by its real targets per sample over the step's, and the
gradient of accumulated micro-batches rescaled at the optimizer step by the step's real targets. Written by hand:
Lightning and accelerate normalise per chunk (Hugging Face's Trainer does this for its own loop only).
Without padding every weight is exactly 1 (the counts are integers, compared exactly): the losses are unchanged."""

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..data.sampling import counted

LossFn = Callable[[Tensor, Tensor], Tensor]


class RealTargets:
    """Counts each micro-batch's real targets over all processes (`count`, before its forward), weighs the loss of
    every chunk of it (`weighted`), and rescales the accumulated gradient and logged loss once per optimizer step
    (`factor`, `scale_gradients`, then `reset`). Targets that are values (floats) are all real: nothing is done."""

    def __init__(self, accumulate: int = 1) -> None:
        self.accumulate = accumulate
        self.reset()

    def reset(self) -> None:
        """At each optimizer step's end (and when a step is skipped): the next micro-batch starts a new step."""
        self.reference: Tensor | None = None  # [samples, real targets] of the step's first micro-batch, all processes
        self.step: Tensor | int = 0  # [samples, real targets] of the step's micro-batches so far, all processes

    def count(self, target: Tensor) -> None:
        """Before the forward of each micro-batch, on every process (a collective when there are several): this
        process's local batch of targets, whole (before any split into replicas or micro-batches)."""
        if target.is_floating_point():
            return
        # (torch.full, not torch.tensor: a copy from the host would wait for the GPU at every step)
        counts = torch.stack([torch.full((), len(target), device=target.device), counted(target).sum()])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)  # processes that share a batch (shards, stages) count it each: ratios still hold
        if self.reference is None:
            self.reference = counts
        self.step = self.step + counts

    def weighted(self, loss_fn: LossFn) -> LossFn:
        """`loss_fn` (a mean over the real targets it is given) weighted for the chunk it is given."""

        def loss(logits: Tensor, target: Tensor) -> Tensor:
            mean = loss_fn(logits, target)
            if self.reference is None or target.is_floating_point():
                return mean  # (outside a training step: the batch-size search's trial steps)
            samples, real = (value.to(target.device) for value in self.reference)
            here = counted(target).sum()
            # (real targets here / samples here) / (real / samples) of the step, from integer products: exactly 1
            # when the padding is spread evenly (none at all). A chunk of padding only has a NaN mean: weight 0.
            weight = (here * samples) / (len(target) * real.clamp(min=1))
            return torch.where(here > 0, mean * weight.to(mean.dtype), mean.new_zeros(()))

        return loss

    def factor(self) -> Tensor | None:
        """What the optimizer step's gradient and summed loss are multiplied by: the micro-batches were weighted by
        the first one's real targets per sample, the step's are these (None: one micro-batch, nothing to do). Exactly
        1 without padding, also for a step of fewer micro-batches than `accumulate` (Lightning divides its losses by
        `accumulate` still: the last of an epoch whose batches do not fill it)."""
        if self.accumulate == 1 or self.reference is None:
            return None
        samples, real = self.reference
        return (real.clamp(min=1) * self.step[0]) / (samples * self.step[1].clamp(min=1))

    def scale_gradients(self, parameters: Iterable[nn.Parameter]) -> None:
        """Before clipping and the optimizer step. On the device, with no host sync: exactly 1 without padding."""
        if (factor := self.factor()) is None:
            return
        groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}  # one multiply per device and dtype
        for parameter in parameters:
            if parameter.grad is not None:
                grad = parameter.grad
                local = grad.to_local() if hasattr(grad, "to_local") else grad  # a sharded (DTensor) gradient
                groups.setdefault((local.device, local.dtype), []).append(local)
        for (device, dtype), grads in groups.items():
            torch._foreach_mul_(grads, factor.to(device, dtype))
