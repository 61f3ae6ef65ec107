"""Write each epoch's validation metrics to a file (tracking/epoch_metrics.py) for the hyperparameter search."""

from pathlib import Path

import lightning as L

from ...tracking.epoch_metrics import append_epoch_metrics, is_final


class EpochMetricsFile(L.Callback):
    """Appends the val/* metrics of every validation (not the sanity check) to `path`, from rank 0; they are
    already reduced over the processes (logged with sync_dist)."""

    def __init__(self, path: str | Path) -> None:
        self.path = path

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {name: value for name, value in trainer.callback_metrics.items() if name.startswith("val/")}
        epoch, steps = trainer.current_epoch, trainer.global_step
        append_epoch_metrics(self.path, epoch, metrics, is_final(epoch, trainer.max_epochs, steps, trainer.max_steps))
