"""Log training-step metrics as Python numbers, with one host sync per logging step.

`.item()` on a CUDA tensor waits for the GPU; doing it every step stalls the pipeline. Keeping the
tensors themselves (e.g. appending the loss to a list) is worse: each one keeps its step's graph and
activations alive, and memory grows with every step. This callback keeps a detached running sum on
the device and turns it into floats only when it logs.
"""

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..lightning_private import only_accumulates
from ..module import writes_step_metrics


class ItemMetricLogger(L.Callback):
    """Logs train/<name>_mean: the mean, over the batches since the last log, of every scalar tensor the
    training step returns, and train/loss_mean, the mean of the optimizer steps' losses (train/loss) since then,
    each averaged over the processes. Logs on the steps where
    Lightning writes train/loss (every trainer.log_every_n_steps optimizer steps), at its step numbers."""

    setting, turn_off = "oom.log_loss_mean", "oom.log_loss_mean=false"  # what refusals name

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0  # batches (each optimizer step's micro-batches count one each)
        self.steps = 0  # optimizer steps
        self.step_loss: torch.Tensor | float = 0.0  # the sum of this optimizer step's micro-batch losses so far
        self.host_syncs = 0
        self._warned = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if not isinstance(outputs, dict) or "loss" not in outputs:  # a skipped step returns nothing
            return
        self._warn_about_graphs(outputs)
        for name, value in outputs.items():
            if name != "loss" and torch.is_tensor(value) and value.numel() == 1:
                value = value.detach().float().reshape(())
                self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.count += 1
        # Lightning divides each of trainer.accumulate_grad_batches batches' losses by their number: their sum is the
        # optimizer step's loss (the module's train/loss), times the padding's factor where targets are padded.
        self.step_loss = self.step_loss + outputs["loss"].detach().float().reshape(())
        if pl_module.automatic_optimization and only_accumulates(trainer):
            return
        real_targets = getattr(pl_module, "real_targets", None)  # (the template's modules; None in one of yours)
        if real_targets is not None and (factor := real_targets.factor()) is not None:
            self.step_loss = self.step_loss * factor  # (read before the module's own hook resets it: it runs after)
        self.sums["loss"] = self.sums["loss"] + self.step_loss if "loss" in self.sums else self.step_loss
        self.step_loss, self.steps = 0.0, self.steps + 1
        if writes_step_metrics(trainer):
            self._log(trainer, step=trainer.global_step - 1)  # the index of the step just taken, as Lightning's

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sums, self.count, self.steps, self.step_loss = {}, 0, 0, 0.0

    def _log(self, trainer: L.Trainer, step: int) -> None:
        if not self.sums:
            return
        names = sorted(self.sums)
        means = torch.stack([self.sums[name] / (self.steps if name == "loss" else self.count) for name in names])
        if hasattr(trainer.strategy, "mean_of_step_metrics"):  # a pipeline: only its last stage has every loss
            means = trainer.strategy.mean_of_step_metrics(means)
        else:
            means = trainer.strategy.reduce(means, reduce_op="mean")
        values = means.tolist()  # the one host sync of this logging step
        self.host_syncs += 1
        self.sums, self.count, self.steps = {}, 0, 0
        metrics = {f"train/{name}_mean": value for name, value in zip(names, values, strict=True)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def _warn_about_graphs(self, outputs: dict) -> None:
        if self._warned:
            return
        carrying = [name for name, value in outputs.items() if name != "loss" and getattr(value, "grad_fn", None)]
        if carrying:
            self._warned = True
            rank_zero_warn(
                f"training_step returned {carrying} with an autograd graph: anything that keeps them keeps the "
                "step's activations alive. Return value.detach() instead."
            )
