"""Evaluating a split over every process (each sample counted once) and logging a row to wandb."""

import itertools
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device
from rich.console import Console
from rich.table import Table
from torch import nn

from ..runtime.metrics import correct_predictions, perplexity, summed_loss


@torch.no_grad()
def evaluate(
    accelerator: Accelerator,
    model: nn.Module,
    loader: Any,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    limit: int | float | None = None,
) -> dict[str, float]:
    """Loss, accuracy and perplexity (exp of the loss; both for classes, not values) over the split, exact:
    per-target sums are reduced over the processes, then divided by the number of targets (every sample is
    evaluated once: the eval sampler does not repeat any). `limit`: Lightning's limit_val_batches or
    limit_test_batches, batches per process (an int) or a share of them (a float); None: all."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
    values = False  # float targets (regression): no accuracy, no perplexity
    for x, y in itertools.islice(loader, batches(limit, len(loader))):
        values = y.is_floating_point()
        x, y = to_device(accelerator, x, y)
        with accelerator.autocast():
            logits = model(x)
        loss_sum, count = summed_loss(loss_fn, logits, y)  # the training's loss (loop.loss_fn, or yours)
        totals[0] += loss_sum
        totals[1] += correct_predictions(logits, y)
        totals[2] += count  # not the targets the eval sampler padded with (see data.EvalSampler)
    loss_sum, correct, count = accelerator.reduce(totals, "sum").tolist()
    model.train()
    if values:
        return {"loss": loss_sum / count}
    return {"loss": loss_sum / count, "acc": correct / count, "perplexity": perplexity(loss_sum / count)}


def batches(limit: int | float | None, available: int) -> int:
    """How many of a loader's batches a limit lets through, as Lightning counts them: a float is a share (one that
    leaves none is refused before the training: data.checks.check_evaluation_batches), an int a count."""
    if limit is None:
        return available
    if isinstance(limit, float):
        return int(available * limit)
    return min(limit, available)


def to_device(accelerator: Accelerator, *batch: Any) -> list[Any]:
    """Host-to-device copies that overlap with compute on a GPU (the loaders pin their memory there); an x of several
    tensors (a tuple, a dict) too, as Lightning moves it."""
    return [send_to_device(part, accelerator.device, non_blocking=True) for part in batch]


def prefixed(split: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{split}/{name}": value for name, value in metrics.items()}


def log(accelerator: Accelerator, metrics: dict[str, float], step: int) -> None:
    """One wandb row (main process only). The step is a metric, as Lightning's WandbLogger logs it, so runs
    of both engines chart alike."""
    accelerator.log({**metrics, "trainer/global_step": step})


def show(metrics: dict[str, float]) -> None:
    """The test metrics as a table on the console, as Lightning's trainer.test prints them."""
    table = Table("Test metric", "Value")
    for name, value in sorted(metrics.items()):
        table.add_row(name, f"{value:.6g}")
    Console().print(table)
