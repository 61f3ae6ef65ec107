"""The OOM toolkit for the Accelerate loop (`oom=toolkit`): a batch-size search that all processes make
together (the Lightning engine's algorithm and metric names), and every device's memory on every process,
logged each epoch. What counts as an OOM error is memory.py's. (`.item()` at intervals needs nothing here:
train.py only reads the loss on logging steps.)"""

import time

import torch
from accelerate import Accelerator
from accelerate.utils.memory import clear_device_cache
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader

from .data import Data, per_device_batch_size
from .memory import is_oom_error, memory_metrics, process_memory_figures, search
from .strategies import LossFn, Strategy


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
) -> None:
    """Find the largest per-device batch whose training step (forward, backward AND the optimizer step, which
    allocates Adam's state) fits on every process, keep `margin` below it; data.batch_size (GLOBAL) becomes
    per-device x replicas. The same search as the Lightning engine's BatchSizeFinder (memory.search: double
    until a size fails, then bisect), with the same metric names (batch_size_finder/*).

    accelerate's find_executable_batch_size decides per process and only shrinks, so after an OOM on one rank
    the ranks train with different batches, or wait forever in the next collective. Here each trial runs
    without gradient sync (no collective inside it), then one all-reduce tells every process whether any of
    them ran out of memory. The weights and optimizer state are restored after the search.
    """
    start, old_global = time.perf_counter(), data.batch_size
    data.setup()
    train = data.splits["train"]
    x, y = next(iter(DataLoader(train, batch_size=max_batch_size)))  # enough samples for the largest trial
    saved = cpu_copy((model.state_dict(), optimizer.state_dict(), torch.random.get_rng_state()))

    def fits(size: int) -> bool:
        fitted = _trial_step(accelerator, strategy, model, optimizer, x[:size], y[:size], loss_fn)
        clear_device_cache(garbage_collection=True)  # outside the except block: the failed step's tensors are gone
        failures = accelerator.reduce(torch.tensor([0.0 if fitted else 1.0], device=accelerator.device), "sum")
        return failures.item() == 0

    maximum = min(max_batch_size, len(train) // replicas)
    largest, trials = search(fits, per_device_batch_size(data.batch_size, replicas), maximum, tolerance)
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    torch.random.set_rng_state(saved[2])
    if largest == 0:
        raise RuntimeError("find_batch_size: not even a batch of 1 fits in memory")
    per_device = max(1, min(maximum, int(largest * (1 - margin))))
    data.batch_size = per_device * replicas
    accelerator.print(
        f"find_batch_size: largest per-device batch that fits {largest}; using {per_device} per device "
        f"(global {old_global} -> {data.batch_size}) after {trials} trials"
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
