"""The OOM toolkit for the Accelerate loop (`oom=toolkit`): a batch-size search that all processes make
together, and every process's memory, logged each epoch. What counts as an OOM error is memory.py's.
(`.item()` at intervals needs nothing here: train.py only reads the loss on logging steps.)"""

import torch
from accelerate import Accelerator
from accelerate.utils.memory import clear_device_cache
from torch import nn

from .data import SyntheticData, per_device_batch_size
from .memory import device_memory_figures, is_oom_error
from .strategies import LossFn, Strategy


def find_batch_size(
    accelerator: Accelerator,
    strategy: Strategy,
    model: nn.Module,
    data: SyntheticData,
    replicas: int,
    loss_fn: LossFn,
    shrink: float = 0.5,
) -> None:
    """Shrink the per-device batch until a training step fits on every process; data.batch_size (GLOBAL)
    becomes per-device x replicas.

    accelerate's find_executable_batch_size decides per process, so after an OOM on one rank the ranks train
    with different batches, or wait forever in the next collective. Here each trial runs without gradient sync
    (no collective inside it), then one all-reduce tells every process whether any of them ran out of memory.
    """
    per_device = per_device_batch_size(data.batch_size, replicas)
    data.setup()
    x, y = data.splits["train"][:per_device]
    while True:
        fits = _trial_step(accelerator, strategy, model, x[:per_device], y[:per_device], loss_fn)
        clear_device_cache(garbage_collection=True)  # outside the except block: the failed step's tensors are gone
        failures = accelerator.reduce(torch.tensor([0.0 if fits else 1.0], device=accelerator.device), "sum")
        if failures.item() == 0:
            break
        if per_device == 1:
            raise RuntimeError("find_batch_size: not even a batch of 1 fits in memory")
        per_device = max(1, int(per_device * shrink))
    found = per_device * replicas
    if found != data.batch_size:
        accelerator.print(f"find_batch_size: {per_device} per device fits; global batch {data.batch_size} -> {found}")
    data.batch_size = found
    found_sizes = {"batch_size_finder/per_device_batch_size": per_device, "batch_size_finder/global_batch_size": found}
    accelerator.log({**found_sizes, "trainer/global_step": 0})


def _trial_step(
    accelerator: Accelerator, strategy: Strategy, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn
) -> bool:
    """One forward and backward (no optimizer step); False on an out-of-memory error."""
    try:
        with accelerator.no_sync(model):
            strategy.train_step(accelerator, model, x.to(accelerator.device), y.to(accelerator.device), loss_fn)
        return True
    except Exception as error:
        if not is_oom_error(error):
            raise
        return False
    finally:
        model.zero_grad(set_to_none=True)


def log_device_memory(accelerator: Accelerator, step: int) -> None:
    """Every process's peak memory since the last call, and the imbalance between them (max / min)."""
    figures = device_memory_figures(accelerator.device)
    local = torch.tensor([list(figures.values())], dtype=torch.float64, device=accelerator.device)
    rows = accelerator.gather(local).tolist()
    metrics = {f"memory/rank{rank}/{name}": row[i] for rank, row in enumerate(rows) for i, name in enumerate(figures)}
    first = [row[0] for row in rows]  # peak allocated on CUDA, RSS elsewhere
    metrics["memory/imbalance"] = max(first) / min(first) if min(first) > 0 else float("inf")
    accelerator.log({**metrics, "trainer/global_step": step})
