"""The batch-size search (oom.find_batch_size=true): the largest per-device batch whose training step fits on every
process, found by all of them together."""

import time
from functools import partial

import torch
from accelerate import Accelerator
from accelerate.utils.memory import clear_device_cache
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader

from ...data.batch_sizes import batch_parts, global_batch_size, per_device_batch_size
from ...data.loading import Data
from ...runtime import memory
from ...runtime.memory import LR_SCALINGS, changed_batch_message, is_oom_error, with_margin
from ...runtime.optimization import scale_lr
from ..strategies import LossFn, Strategy


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
    steps_per_trial: int = 2,
    lr_scaling: str = "none",
    accumulation: int = 1,
) -> None:
    """Find the largest per-device batch whose training step (forward, backward AND the optimizer step, which
    allocates Adam's state) fits on every process, keep `margin` below it; data.batch_size (GLOBAL) becomes
    per-device x `accumulation` (micro-batches per optimizer step) x replicas. The same search as the Lightning
    engine's BatchSizeFinder (memory.search: double until a size fails, then bisect; `steps_per_trial` optimizer
    steps per size), with the same metric names (batch_size_finder/*). lr_scaling "linear" or "sqrt" scales the
    learning rate the schedule starts from with the global batch (the caller builds the schedule again).

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

    def fits(size: int, steps: int = steps_per_trial) -> bool:
        step = partial(_trial_step, accelerator, strategy, model, optimizer, x[:size], y[:size], loss_fn)
        fitted = all(step() for _ in range(steps))  # no cache emptied between steps, as in training
        clear_device_cache(garbage_collection=True)  # outside the except block: the failed step's tensors are gone
        failures = accelerator.reduce(torch.tensor([0.0 if fitted else 1.0], device=accelerator.device), "sum")
        return failures.item() == 0

    def fits_from_the_start(size: int) -> bool:
        fitted = fits(size, steps=max(2, steps_per_trial))  # the first allocates the optimizer state, as in training
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
    per_device = with_margin(largest, maximum, margin)
    # The trials ran with the optimizer state their first step allocated; training starts without it and
    # allocates it after its first step's activations: another layout in the device's memory (measured on an H200:
    # 76-129 MiB reserved but unusable, more than the margin). The size is checked from that start, as training will
    # run it (two steps), and shrinks until it fits.
    while per_device > 1 and not fits_from_the_start(per_device):
        per_device = max(1, int(per_device * (1 - max(margin, 0.05))))
    data.batch_size = global_batch_size(per_device, replicas, accumulation)
    lr_factor = LR_SCALINGS[lr_scaling](data.batch_size / old_global)
    scale_lr(optimizer, lr_factor)
    accelerator.print(
        f"find_batch_size: largest per-device batch that fits {largest}; using {per_device} per device after "
        f"{trials} trials in {time.perf_counter() - start:.1f}s: "
        f"{changed_batch_message(old_global, data.batch_size, len(train))} (lr x{lr_factor:.3g})"
    )
    found = {
        "batch_size_finder/largest_fitting": largest,
        "batch_size_finder/per_device_batch_size": per_device,
        "batch_size_finder/global_batch_size": data.batch_size,
        "batch_size_finder/trials": trials,
        "batch_size_finder/seconds": time.perf_counter() - start,
        "batch_size_finder/lr_factor": lr_factor,
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
