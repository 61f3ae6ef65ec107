"""Every rank's memory, logged each epoch by rank 0, with the imbalance between ranks.

One device filling up before the others (DataParallel gathers outputs and the loss on GPU 0) is the
first thing to look for when a multi-GPU run runs out of memory; max / min over the ranks shows it.
"""

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from ..memory import device_memory_figures


class DeviceMemoryMonitor(L.Callback):
    """CUDA: peak allocated and peak reserved MiB per rank since the last epoch end. Elsewhere: the
    process's resident memory (RSS). Logged as memory/rank<r>/<figure> and memory/imbalance."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        figures = device_memory_figures(pl_module.device)
        local = torch.tensor(list(figures.values()), dtype=torch.float64, device=pl_module.device)
        gathered = trainer.strategy.all_gather(local).reshape(trainer.world_size, len(figures)).tolist()
        metrics = {
            f"memory/rank{rank}/{name}": row[column]
            for rank, row in enumerate(gathered)
            for column, name in enumerate(figures)
        }
        first = [row[0] for row in gathered]  # peak allocated on CUDA, RSS elsewhere
        imbalance = max(first) / min(first) if min(first) > 0 else float("inf")
        metrics["memory/imbalance"] = imbalance
        per_rank = ", ".join(f"{value:.0f}" for value in first)
        rank_zero_info(f"DeviceMemoryMonitor: {next(iter(figures))} per rank [{per_rank}], max/min {imbalance:.2f}")
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
