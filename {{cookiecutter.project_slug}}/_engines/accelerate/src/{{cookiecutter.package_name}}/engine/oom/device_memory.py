"""Every device's peak memory on every process (oom.log_memory), logged each epoch."""

import torch
from accelerate import Accelerator

from ...runtime.memory import memory_metrics, process_memory_figures
from ..strategies import Strategy


def log_device_memory(accelerator: Accelerator, strategy: Strategy, step: int) -> None:
    """Every device's peak memory on every process since the last call, and the imbalance between them."""
    names, rows = process_memory_figures([accelerator.device, *strategy.devices_in_use()])
    local = torch.tensor([rows], dtype=torch.float64, device=accelerator.device)
    gathered = accelerator.gather(local).tolist()
    accelerator.log({**memory_metrics(names, gathered), "trainer/global_step": step})
