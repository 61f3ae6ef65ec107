"""The progress bar: Lightning's TQDM bar, at no cost on the training steps it does not redraw, showing the last logged
train/loss (as the Accelerate engine's bar does) and not wandb's run id (`v_num`)."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar


class ProgressBar(TQDMProgressBar):
    """Lightning's TQDMProgressBar, redrawn as it is: every `refresh_rate` training batches and at the epoch's last.
    On the other steps its hook returns at once; Lightning's reads the bar's total and its settings first, a few
    calls on every step of a training whose steps may take a millisecond."""

    _redraw_every, _batches = 0, None  # set when an epoch starts

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        # What Lightning's test reads every step, fixed for the epoch: 0 when the bar is off (e.g. rank > 0).
        self._redraw_every = self.refresh_rate if self.is_enabled else 0
        self._batches = self.train_progress_bar.total

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        done, every = batch_idx + 1, self._redraw_every
        if every and (done % every == 0 or done == self._batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A training stopped between redraws (trainer.max_steps, Ctrl-C) left an older frame as the log's last
        # (`0/32` after 12 steps): drawn once more where it stopped
        bar = self._train_progress_bar
        if self.is_enabled and bar is not None and not bar.disable:
            bar.n = trainer.fit_loop.epoch_loop.batch_progress.current.completed
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()
        super().on_train_end(trainer, pl_module)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # (the wandb run's id: in its folder's name and the run's first lines)
        return metrics
