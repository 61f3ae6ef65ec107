"""Recovery from an out-of-memory error in a training step (oom.recovery): skip the batch, or redo the step in
micro-batches of half the size, every process deciding together."""

from functools import partial

import torch
from accelerate import Accelerator
from accelerate.utils.memory import clear_device_cache
from torch import nn

from ...errors import ConfigError
from ...runtime.memory import (
    OutOfMemoryStop,
    halved,
    is_oom_error,
    rng_state,
    set_rng_state,
    why_recovery_refuses,
)
from ..strategies import LossFn, Strategy


class OOMRecovery:
    """Trains a batch as `strategy.train_step` does, surviving an out-of-memory error in its forward or backward.

    policy: "split" keeps the batch (data.batch_size stays the global batch) and runs every step as gradient
    accumulation over micro-batches of `micro_batch_size` samples per process, the largest that fits: it starts at
    the whole per-process batch; an OOM on any process halves it on every process and the step is redone from the
    same weights and random state, so the step, its loss and its gradient are the whole batch's (the losses of a
    run without OOMs). The size is saved in checkpoints (the loop's Progress.oom_recovery, this object's
    state_dict) and a resumed run starts from it. (The idea of Composer's device_train_microbatch_size="auto", for
    data-parallel runs.) "skip" drops the batch (the optimizer step that follows changes nothing).
    max_consecutive: OOMs in a row, without a step that worked in between, before stopping.
    empty_cache_every_n_epochs: 0 never (emptying the cache synchronises the device, so it is done at epoch ends only).

    Every micro-batch runs under no_sync (no collective that a failed process would leave the others waiting
    in); then one all-reduced flag tells every process whether any ran out of memory, so all decide together,
    and only then are the gradients averaged over the processes, in one all-reduce (what DDP's backward would
    have done). accelerate's own accumulation (accelerator.accumulate) counts loader batches and cannot redo one,
    and find_executable_batch_size decides per process: hence the hand-written loop. A net whose forward is
    itself a collective (synchronised BatchNorm) is refused by engine/training.py: an OOM mid-forward would leave the
    other processes in it.
    """

    supported_presets = ("single", "ddp", "ddp_spawn")

    def __init__(
        self, strategy: Strategy, policy: str = "split", max_consecutive: int = 3, empty_cache_every_n_epochs: int = 0
    ) -> None:
        if strategy.name not in self.supported_presets:
            raise ConfigError(
                f"oom.recovery works under strategy={'|'.join(self.supported_presets)}, not strategy={strategy.name}"
                f"{why_recovery_refuses(strategy.name)}; turn it off with oom.recovery=null"
            )
        if policy not in ("skip", "split"):
            raise ConfigError(f"oom.recovery.policy={policy!r} is unknown; valid: skip, split")
        self.strategy, self.policy, self.max_consecutive = strategy, policy, max_consecutive
        self.empty_cache_every_n_epochs = empty_cache_every_n_epochs
        self.events = self.consecutive = 0
        self.micro_batch_size = 0  # samples per micro-batch on each process, the last that fitted; 0: the whole batch

    def epoch_ended(self, epoch: int) -> None:
        """After epoch `epoch` (from 0): empty the allocator's cache every empty_cache_every_n_epochs epochs."""
        every = self.empty_cache_every_n_epochs
        if every and (epoch + 1) % every == 0:
            clear_device_cache(garbage_collection=True)

    def state_dict(self) -> dict[str, int]:
        return {"micro_batch_size": self.micro_batch_size, "events": self.events}

    def load_state_dict(self, state: dict[str, int], accelerator: Accelerator) -> None:
        """Restore a checkpoint's state (an empty one: a checkpoint without it), then agree on the smallest
        micro-batch size of all processes (0, the whole batch, is the largest)."""
        self.micro_batch_size, self.events = state.get("micro_batch_size", 0), state.get("events", 0)
        size = torch.tensor([self.micro_batch_size or 2**62], device=accelerator.device)
        smallest = int(accelerator.gather(size).min())
        self.micro_batch_size = 0 if smallest == 2**62 else smallest
        if self.micro_batch_size:
            accelerator.print(f"OOMRecovery: micro-batches of {self.micro_batch_size}, as the checkpoint says")

    def train_step(
        self, accelerator: Accelerator, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, step: int
    ) -> torch.Tensor | None:
        """Forward and backward of the batch, gradients averaged over the processes; the (detached) loss, or None
        for a skipped batch (its gradients are None)."""
        rng = rng_state(accelerator.device)
        while True:
            micro = min(self.micro_batch_size or len(x), len(x))
            loss, oom = None, False
            try:
                with accelerator.no_sync(model):
                    loss = self._forward_backward(accelerator, model, x, y, loss_fn, micro)
            except Exception as error:
                if not is_oom_error(error):
                    raise
                oom = True
            failures = accelerator.reduce(torch.tensor([float(oom)], device=accelerator.device), "sum")
            if failures.item() == 0:
                break
            loss = None  # drop the failed step's graph before freeing
            model.zero_grad(set_to_none=True)
            if self.policy == "split":
                self.micro_batch_size = halved(micro)  # at 1 already: try again until max_consecutive stops it
            self._on_oom(accelerator, step, micro)
            if self.policy == "skip":
                return None
            set_rng_state(accelerator.device, rng)  # the redone step draws what the first try drew (dropout)
        if self.consecutive:
            accelerator.print(f"OOMRecovery: micro-batches of {micro} fit; later steps start from that size")
        self.consecutive = 0
        average_gradients(accelerator, model)
        return loss

    def _forward_backward(self, accelerator, model, x, y, loss_fn: LossFn, micro: int) -> torch.Tensor:
        """The strategy's step on each micro-batch of `micro` samples, its loss weighted by its share: the gradients
        accumulate to the whole batch's, and the sum of the returned losses is its loss."""
        total = torch.zeros((), device=accelerator.device)
        for x_part, y_part in zip(x.split(micro), y.split(micro), strict=True):
            weighted = partial(_weighted, loss_fn, len(x_part) / len(x))
            total += self.strategy.train_step(accelerator, model, x_part, y_part, weighted)
        return total

    def _on_oom(self, accelerator: Accelerator, step: int, micro: int) -> None:
        clear_device_cache(garbage_collection=True)  # outside the except block: the failed step's tensors are gone
        self.events += 1
        self.consecutive += 1
        accelerator.print(
            f"OOMRecovery: out of memory at step {step} (micro-batches of {micro}; {self.consecutive} in a row, "
            f"policy {self.policy})"
        )
        # The micro-batch size from now on (split: halved; skip: unchanged).
        metrics = {
            "oom/events": self.events,
            "oom/consecutive": self.consecutive,
            "oom/micro_batch_size": self.micro_batch_size or micro,
        }
        accelerator.log({**metrics, "trainer/global_step": step})
        if self.consecutive >= self.max_consecutive:  # the loop saves a checkpoint, then stops
            raise OutOfMemoryStop(self.consecutive, step, self.policy, "oom.recovery.policy")


def _weighted(loss_fn: LossFn, share: float, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return loss_fn(logits, target) * share


def average_gradients(accelerator: Accelerator, model: nn.Module) -> None:
    """Average the gradients over the processes, as DDP's backward does, in one all-reduce of all of them."""
    if accelerator.num_processes == 1:
        return
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    averaged = accelerator.reduce(torch.cat([grad.reshape(-1) for grad in grads]), "mean")
    for grad, part in zip(grads, averaged.split([grad.numel() for grad in grads]), strict=True):
        grad.copy_(part.view_as(grad))
