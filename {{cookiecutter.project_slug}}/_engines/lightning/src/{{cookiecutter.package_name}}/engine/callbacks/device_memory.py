"""Every device's memory, on every rank, logged each epoch by rank 0, with the imbalance between them.

One device filling up before the others (DataParallel gathers outputs and the loss on GPU 0) is the
first thing to look for when a multi-GPU run runs out of memory; max / min over all devices shows it.
"""

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from ...runtime.memory import memory_metrics, process_memory_figures


class DeviceMemoryMonitor(L.Callback):
    """CUDA: peak allocated and peak reserved MiB of each device the process uses (dp's replicas, the layer
    groups of model_parallel mode=layers) since the last epoch end. Elsewhere: the process's resident memory
    (RSS). Logged as memory/rank<r>[/device<d>]/<figure> and memory/imbalance."""

    setting, turn_off = "oom.log_memory", "oom.log_memory=false"  # what refusals name

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        strategy = trainer.strategy
        # dp and model_parallel mode=layers use several devices from one process; they list them.
        names, rows = process_memory_figures([pl_module.device, *getattr(strategy, "devices_in_use", [])])
        local = torch.tensor(rows, dtype=torch.float64, device=pl_module.device)
        gathered = strategy.all_gather(local).reshape(trainer.world_size, len(rows), len(names)).tolist()
        metrics = memory_metrics(names, gathered)
        per_device = ", ".join(f"{rows[0]:.0f}" for ranks in gathered for rows in ranks)
        rank_zero_info(
            f"DeviceMemoryMonitor: {names[0]} per device [{per_device}], max/min {metrics['memory/imbalance']:.2f}"
        )
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
