"""The OOM toolkit for the Accelerate loop (`oom=toolkit`): recovery from an out-of-memory error in a training
step, every device's memory on every process logged each epoch, and (opt-in, `oom.find_batch_size=true`) a
batch-size search that all processes make together. The Lightning engine's algorithms and metric names; what
counts as an OOM error is memory.py's. (`.item()` at intervals needs nothing here: engine/loop.py only reads the loss
on logging steps.)"""

import time
from functools import partial

import torch
from accelerate import Accelerator
from accelerate.utils.memory import clear_device_cache
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader

from ..data.loading import Data, batch_parts, global_batch_size, per_device_batch_size
from ..errors import ConfigError
from ..runtime import memory
from ..runtime.memory import (
    OutOfMemoryStop,
    changed_batch_message,
    halved,
    is_oom_error,
    memory_metrics,
    process_memory_figures,
    rng_state,
    set_rng_state,
    why_recovery_refuses,
)
from .strategies import LossFn, Strategy


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

    Every micro-batch runs under no_sync (no collective that a failed process would leave the others waiting
    in); then one all-reduced flag tells every process whether any ran out of memory, so all decide together,
    and only then are the gradients averaged over the processes, in one all-reduce (what DDP's backward would
    have done). accelerate's own accumulation (accelerator.accumulate) counts loader batches and cannot redo one,
    and find_executable_batch_size decides per process: hence the hand-written loop. A net whose forward is
    itself a collective (synchronised BatchNorm) is refused by engine/training.py: an OOM mid-forward would leave the
    other processes in it.
    """

    supported_presets = ("single", "ddp", "ddp_spawn")

    def __init__(self, strategy: Strategy, policy: str = "split", max_consecutive: int = 3) -> None:
        if strategy.name not in self.supported_presets:
            raise ConfigError(
                f"oom.recovery works under strategy={'|'.join(self.supported_presets)}, not strategy={strategy.name}"
                f"{why_recovery_refuses(strategy.name)}; turn it off with oom.recovery=null"
            )
        if policy not in ("skip", "split"):
            raise ConfigError(f"oom.recovery.policy={policy!r} is unknown; valid: skip, split")
        self.strategy, self.policy, self.max_consecutive = strategy, policy, max_consecutive
        self.events = self.consecutive = 0
        self.micro_batch_size = 0  # samples per micro-batch on each process, the last that fitted; 0: the whole batch

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


def find_batch_size(
    accelerator: Accelerator,
    strategy: Strategy,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Data,
    replicas: int,
    loss_fn: LossFn,
    max_batch_size: int = 4096,
    margin: float = 0.1,
    tolerance: float = 0.05,
    accumulation: int = 1,
) -> None:
    """Find the largest per-device batch whose training step (forward, backward AND the optimizer step, which
    allocates Adam's state) fits on every process, keep `margin` below it; data.batch_size (GLOBAL) becomes
    per-device x `accumulation` (micro-batches per optimizer step) x replicas. The same search as the Lightning
    engine's BatchSizeFinder (memory.search: double until a size fails, then bisect), with the same metric names
    (batch_size_finder/*).

    accelerate's find_executable_batch_size decides per process and only shrinks, so after an OOM on one rank
    the ranks train with different batches, or wait forever in the next collective. Here each trial runs
    without gradient sync (no collective inside it), then one all-reduce tells every process whether any of
    them ran out of memory. The weights and optimizer state are restored after the search.
    """
    start, old_global = time.perf_counter(), data.batch_size
    data.setup()
    train = data.splits["train"]
    x, y = next(iter(DataLoader(train, batch_size=max_batch_size, collate_fn=data.collate_fn)))  # the largest trial's
    saved = cpu_copy((model.state_dict(), optimizer.state_dict(), torch.random.get_rng_state()))

    def fits(size: int, steps: int = 1) -> bool:
        step = partial(_trial_step, accelerator, strategy, model, optimizer, x[:size], y[:size], loss_fn)
        fitted = all(step() for _ in range(steps))  # no cache emptied between steps, as in training
        clear_device_cache(garbage_collection=True)  # outside the except block: the failed step's tensors are gone
        failures = accelerator.reduce(torch.tensor([0.0 if fitted else 1.0], device=accelerator.device), "sum")
        return failures.item() == 0

    def fits_from_the_start(size: int) -> bool:
        fitted = fits(size, steps=2)  # the first allocates the optimizer state, as training's first step does
        restore()
        return fitted

    def restore() -> None:
        model.load_state_dict(saved[0])
        optimizer.load_state_dict(saved[1])
        torch.random.set_rng_state(saved[2])
        clear_device_cache(garbage_collection=True)

    maximum = min(max_batch_size, len(train) // batch_parts(replicas, accumulation))  # a trial's batch: one part
    first = per_device_batch_size(data.batch_size, replicas, accumulation)
    largest, trials = memory.search(fits, first, maximum, tolerance)  # by its module: the bench's clock records it
    restore()
    if largest == 0:
        raise RuntimeError("find_batch_size: not even a batch of 1 fits in memory")
    per_device = max(1, min(maximum, int(largest * (1 - margin))))
    # The trials ran with the optimizer state their first step allocated; training starts without it and
    # allocates it after its first step's activations: another layout in the device's memory (measured on an H200:
    # 76-129 MiB reserved but unusable, more than the margin). The size is checked from that start, as training will
    # run it (two steps), and shrinks until it fits.
    while per_device > 1 and not fits_from_the_start(per_device):
        per_device = max(1, int(per_device * (1 - max(margin, 0.05))))
    data.batch_size = global_batch_size(per_device, replicas, accumulation)
    accelerator.print(
        f"find_batch_size: largest per-device batch that fits {largest}; using {per_device} per device after "
        f"{trials} trials: {changed_batch_message(old_global, data.batch_size, len(train))}"
    )
    found = {
        "batch_size_finder/largest_fitting": largest,
        "batch_size_finder/per_device_batch_size": per_device,
        "batch_size_finder/global_batch_size": data.batch_size,
        "batch_size_finder/trials": trials,
        "batch_size_finder/seconds": time.perf_counter() - start,
        "batch_size_finder/lr_factor": 1.0,  # the Lightning finder's lr_scaling=none
    }
    accelerator.log({**found, "trainer/global_step": 0})


def _trial_step(
    accelerator: Accelerator,
    strategy: Strategy,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
) -> bool:
    """One training step, optimizer step included; False on an out-of-memory error."""
    try:
        with accelerator.no_sync(model):
            strategy.train_step(accelerator, model, x.to(accelerator.device), y.to(accelerator.device), loss_fn)
        optimizer.step()
        return True
    except Exception as error:
        if not is_oom_error(error):
            raise
        return False
    finally:
        optimizer.zero_grad(set_to_none=True)


def cpu_copy(value):
    """A copy of a (nested) state on the CPU: a copy on the device would skew the trials."""
    return tree_map(lambda item: item.to("cpu", copy=True) if isinstance(item, torch.Tensor) else item, value)


def log_device_memory(accelerator: Accelerator, strategy: Strategy, step: int) -> None:
    """Every device's peak memory on every process since the last call, and the imbalance between them."""
    names, rows = process_memory_figures([accelerator.device, *strategy.devices_in_use()])
    local = torch.tensor([rows], dtype=torch.float64, device=accelerator.device)
    gathered = accelerator.gather(local).tolist()
    accelerator.log({**memory_metrics(names, gathered), "trainer/global_step": step})
