"""Metrics both engines compute the same way."""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..data.sampling import counted
from ..errors import ConfigError, TrainingStopped

# The validation metrics both engines log (val/acc and val/perplexity for class targets), each with the way it
# improves: checkpoint.monitor names the one the best checkpoint is kept by.
VALIDATION_METRICS = {"val/loss": "min", "val/acc": "max", "val/perplexity": "min"}


def best_mode(monitor: str) -> str:
    """ "min" or "max": which way `monitor` improves (Lightning's ModelCheckpoint mode)."""
    return VALIDATION_METRICS.get(monitor, "min")


def check_monitor(monitor: object, values: bool = False) -> None:
    """checkpoint.monitor names a validation metric (a typo kept the first checkpoint as the best, or failed at the
    first validation, after the run folder was made) the data's targets have: `values` (float targets, a regression)
    log val/loss alone."""
    if monitor not in VALIDATION_METRICS:
        raise ConfigError(
            f"checkpoint.monitor={monitor} is not a validation metric; valid: {', '.join(VALIDATION_METRICS)}"
        )
    if values and monitor != "val/loss":
        raise ConfigError(
            f"checkpoint.monitor={monitor}, but the data's targets are values (a regression), whose validation logs "
            "val/loss alone: give checkpoint.monitor=val/loss"
        )


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean loss of a batch, the template's (strategy=pipeline computes it per micro-batch on the last stage):
    cross-entropy over every target, class logits (B, C) with labels (B,), or a language model's (B, T, V) with
    tokens (B, T); labels of any integer type (int32 ones were a RuntimeError at the first step: cross-entropy takes
    int64)."""
    if logits.dim() < 2:  # (flatten(0, -2): an IndexError at the first step)
        raise ValueError("cross-entropy takes a row of class logits per target, not one value per sample")
    target = target.flatten()
    return F.cross_entropy(logits.flatten(0, -2), target if target.is_floating_point() else target.long())


def summed_loss(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], logits: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """An evaluation batch's loss summed over its targets, and their number, by the engine's own loss (a mean over
    the targets it counts; a loss of yours too): the sums add up exactly over batches and processes. The samples the
    eval sampler padded with (data.sampling.padding_target) are left out before the loss sees them."""
    real_targets = counted(target)
    count = real_targets.sum()
    real = real_targets.reshape(len(target), -1).any(dim=1)  # per sample
    if not real.any():
        return logits.new_zeros((), dtype=torch.float32), count
    if not real.all():
        logits, target = logits[real], target[real]
    return loss_fn(logits.float(), target).float() * count, count


def correct_predictions(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """How many class targets the output predicts: the largest logit of each row, or, for a binary classifier's one
    logit per sample (trained by a loss of yours, binary cross-entropy's), class 1 above 0. Float targets (values):
    none, no accuracy is logged (the argmax of a row compared with a row of targets failed)."""
    if target.is_floating_point():
        return torch.zeros((), dtype=torch.long, device=logits.device)
    if logits.dim() == 1 and logits.shape == target.shape:
        return ((logits > 0).long() == target).sum()
    return (logits.argmax(dim=-1) == target).sum()


def perplexity(mean_loss: float) -> float:
    """exp of the mean cross-entropy; inf past what a float holds (a diverged run logs it instead of crashing)."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf


def check_val_loss(loss: float, epoch: int) -> None:
    """Stop a training whose validation loss is NaN or infinite: its weights went so (a learning rate too high, NaN
    in training samples the checks before training did not read), or the validation data holds such values. It
    went on to its end, choosing its best checkpoint among NaNs, exit 0. The loss is summed over the processes,
    the same on each: they all stop here, before the epoch's metrics are logged and its checkpoint saved (the
    checkpoints saved every N steps since may hold the NaN weights)."""
    if not math.isfinite(loss):
        raise TrainingStopped(
            f"val/loss is {loss} after epoch {epoch}: the weights or the validation data hold NaN or infinite values "
            f"(a learning rate too high, or NaN in the data past the samples checked before training); stopped. {AFTER}"
        )


def check_train_loss(loss: float, step: int) -> None:
    """Stop a training whose logged train/loss (the global batch's, the same on every process) is NaN or infinite,
    at that step: it trained on in NaN to its next validation, and without one (trainer.limit_val_batches=0, a
    trainer.max_steps inside the first epoch) to its end, saving NaN checkpoints and testing them, exit 0."""
    if not math.isfinite(loss):
        raise TrainingStopped(
            f"train/loss is {loss} at step {step}: the weights or this batch hold NaN or infinite values (a learning "
            f"rate too high, or NaN in training samples past those checked before training); stopped. {AFTER}"
        )


AFTER = (  # what to do, once stopped so
    "Its checkpoints saved since may hold those weights: start again from an earlier one (the best in its checkpoints "
    "folder, with ckpt_path=PATH resume=false) or afresh, with a lower model.optimizer.lr"
)
