"""Evaluating a split over every process (each sample counted once) and logging a row to wandb."""

from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn

from ..data.loading import IGNORED
from ..runtime.metrics import perplexity


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: nn.Module, loader: Any) -> dict[str, float]:
    """Loss, accuracy and perplexity (exp of the loss) over the whole split, exact: per-target sums are reduced over
    the processes, then divided by the number of targets (every sample is evaluated once: the eval sampler does
    not repeat any)."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
    for x, y in loader:
        x, y = to_device(accelerator, x, y)
        with accelerator.autocast():
            logits = model(x)
        logits, y = logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)  # one row per target (token)
        totals[0] += F.cross_entropy(logits, y, reduction="sum")
        totals[1] += (logits.argmax(dim=-1) == y).sum()
        totals[2] += (y != IGNORED).sum()  # not the targets the eval sampler padded with (see data.EvalSampler)
    loss_sum, correct, count = accelerator.reduce(totals, "sum").tolist()
    model.train()
    return {"loss": loss_sum / count, "acc": correct / count, "perplexity": perplexity(loss_sum / count)}


def to_device(accelerator: Accelerator, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Host-to-device copies that overlap with compute on a GPU (the loaders pin their memory there)."""
    return [tensor.to(accelerator.device, non_blocking=True) for tensor in tensors]


def prefixed(split: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{split}/{name}": value for name, value in metrics.items()}


def log(accelerator: Accelerator, metrics: dict[str, float], step: int) -> None:
    """One wandb row (main process only). The step is a metric, as Lightning's WandbLogger logs it, so runs
    of both engines chart alike."""
    accelerator.log({**metrics, "trainer/global_step": step})
