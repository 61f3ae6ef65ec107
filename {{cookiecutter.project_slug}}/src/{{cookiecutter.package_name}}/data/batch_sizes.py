"""The batch arithmetic, in one place (the data, every strategy, the batch-size finders and the OOM recovery use it):

    global batch (data.batch_size) = micro-batch x micro-batches accumulated per step x data-parallel replicas

and the trainer.limit_*_batches settings that cut an epoch or an evaluation short."""

import math
from typing import Any

import numpy as np

from ..errors import ConfigError


def batch_parts(replicas: int, accumulate: int = 1) -> int:
    """How many micro-batches one global batch is cut into: one per replica and accumulated micro-batch."""
    return replicas * accumulate


def check_limit(name: str, limit: Any) -> None:
    """Refuse, before training, a trainer.limit_*_batches that is not a count or a share (negative, a share above 1,
    not a number): Lightning's own words were a comparison's TypeError."""
    valid = limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0)
    valid = valid or (isinstance(limit, float) and 0.0 <= limit <= 1.0)
    if not valid:
        raise ConfigError(f"trainer.{name}={limit} must be a number of batches (0 or more) or a share from 0.0 to 1.0")


def check_epoch_batches(limit: int | float | None, batches: int, accumulate: int) -> None:
    """The `batches` of an epoch under trainer.limit_train_batches=`limit` train something and end on an optimizer
    step (Lightning would step after the epoch's last micro-batch on a smaller global batch)."""
    if batches == 0:
        raise ConfigError(
            f"trainer.limit_train_batches={limit} leaves no training batch in an epoch: give a number of batches "
            "(1 or more) or a larger share"
        )
    if batches % accumulate:
        raise ConfigError(
            f"trainer.limit_train_batches={limit} makes epochs of {batches} micro-batches, which "
            f"trainer.accumulate_grad_batches={accumulate} does not divide: the last step would be a smaller batch; "
            f"give a multiple of {accumulate}"
        )


def global_batch_size(micro_batch_size: int, replicas: int, accumulate: int = 1) -> int:
    """The global batch (data.batch_size) of micro-batches of `micro_batch_size` samples on each replica."""
    return micro_batch_size * batch_parts(replicas, accumulate)


def per_device_batch_size(global_batch_size: int, replicas: int, accumulate: int = 1) -> int:
    """The micro-batch each replica computes at once: the global batch divided over the data-parallel replicas
    and the micro-batches accumulated per optimizer step (trainer.accumulate_grad_batches); a clear error if it
    does not divide."""
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int | np.integer):
        # (12.0 reached the DataLoader: a traceback after the run folder and the wandb run were made)
        finite = isinstance(global_batch_size, float) and math.isfinite(global_batch_size)
        low = math.floor(global_batch_size) if finite else None
        hint = "" if low is None else f": data.batch_size={low}" if low == global_batch_size else ""
        hint = hint or ("" if low is None else f"; nearest: {low} or {low + 1}")
        if isinstance(global_batch_size, str):  # (a ${oc.env:NAME} of the command line: text)
            hint = "; a value read with ${oc.env:NAME} is text: give ${oc.decode:${oc.env:NAME}}"
        raise ConfigError(
            f"data.batch_size={global_batch_size} must be a whole number of samples (the global batch){hint}"
        )
    if accumulate < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches={accumulate} must be 1 or more (micro-batches per step)")
    parts = batch_parts(replicas, accumulate)
    if accumulate > 1 and (global_batch_size < 1 or global_batch_size % parts):
        raise ConfigError(
            f"data.batch_size={global_batch_size} is the global batch = micro-batch x "
            f"trainer.accumulate_grad_batches={accumulate} x {replicas} data-parallel replicas, so a positive "
            f"multiple of {parts}; nearest valid: {nearest_multiples(global_batch_size, parts)}"
        )
    if global_batch_size < 1 or global_batch_size % replicas:
        raise ConfigError(
            f"data.batch_size={global_batch_size} is the global batch and must be a positive multiple of the "
            f"{replicas} data-parallel replica{'s' if replicas > 1 else ''}; nearest valid: "
            f"{nearest_multiples(global_batch_size, replicas)}"
        )
    return global_batch_size // parts


def nearest_multiples(value: int, factor: int) -> str:
    below = max(factor, value // factor * factor)
    return str(factor) if value < factor else f"{below} or {below + factor}"


def batches_per_epoch(batches: int, limit: int | float | None) -> int:
    """The training batches an epoch runs under trainer.limit_train_batches, as Lightning counts them: an int caps
    them, a float is a fraction of them (1.0 or null: all)."""
    if limit is None:
        return batches
    return min(batches, limit) if isinstance(limit, int) else int(batches * limit)
