"""activation_checkpointing=full|selective: keep less of each block's activations for the backward, recompute the
rest there (torch.utils.checkpoint, non-reentrant): less memory per sample, so a bigger batch or model fits, for more
compute per step. Per block of the model's Split, as torchtitan does, in both engines and every preset but dp.

- full: each block keeps only its input; its whole forward runs again in the backward (about one more forward).
- selective: each block keeps the outputs of its matrix multiplications and attention (the costly ops) and
  recomputes the cheap rest (norms, activations, dropout), torch's selective checkpointing.

In place, like compile=true (compilation.py): each block's `forward` is wrapped, the net keeps its class and
parameter names (checkpoints are the same with it on or off), and the preset shards, wraps or cuts the net as
before; with compile=true the compiler sees the wrapped blocks. Random numbers (dropout) are replayed in the
recomputation, so the losses equal activation_checkpointing=none; BatchNorm's running statistics are put back after
it, as one forward leaves them.
"""

import functools
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..errors import ConfigError
from ..parallel.split import layers, require_split

MODES = ("none", "full", "selective")
# What selective keeps: the outputs of the costly ops; everything else is recomputed.
SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}
DP_REFUSAL = (
    "strategy=dp does not support activation_checkpointing: nn.DataParallel copies the net into a thread per GPU at "
    "every step, and the copies would recompute with the original's weights; use strategy=ddp"
)


def check_activation_checkpointing(net: nn.Module, mode: str) -> None:
    """Refuse, before training, an unknown mode, or a net without a Split (whose blocks are what is recomputed)."""
    if mode not in MODES:
        raise ConfigError(f"activation_checkpointing={mode} is unknown; valid: {', '.join(MODES)}")
    if mode != "none":
        require_split(net, f"activation_checkpointing={mode}", "recomputes each block of")


def checkpoint_blocks(net: nn.Module, mode: str) -> None:
    """Wrap the forward of each block of `net`'s Split (in place; a no-op for "none" and the second time)."""
    check_activation_checkpointing(net, mode)
    if mode == "none" or getattr(net, "_activation_checkpointing", None):
        return
    split_net, _, blocks, _ = layers(net, f"activation_checkpointing={mode}")
    for name in blocks:
        block = split_net.get_submodule(name)
        norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        block._running_norms = norms  # found once; a plain list (not submodules: the state dict stays the same)
        block.forward = functools.partial(_recomputed, block.forward, mode == "selective", block if norms else None)
    net._activation_checkpointing = mode


def _recomputed(forward: Callable, selective: bool, with_norms: nn.Module | None, *args, **kwargs):
    """The block's forward, checkpointed. `with_norms`: the block, if it has BatchNorm's running statistics, which
    its eager recomputation would update a second time; a compiled one does not replay them (and torch takes only
    dispatch modes as a compiled checkpoint's contexts)."""
    if with_norms is not None and not torch.compiler.is_compiling():
        context = functools.partial(_contexts, selective, with_norms)
    else:
        context = _selective_contexts if selective else None
    extra = {"context_fn": context} if context else {}
    return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)


def _selective_contexts() -> tuple[Any, Any]:
    return create_selective_checkpoint_contexts(_keep_costly_ops)


def _contexts(selective: bool, block: nn.Module) -> tuple[Any, Any]:
    """(forward's, recomputation's) contexts: selective's policy, and BatchNorm's running statistics kept as the
    forward left them."""
    forward, recompute = _selective_contexts() if selective else (nullcontext(), nullcontext())
    return forward, _RunningStatsKept(block._running_norms, recompute)


class _RunningStatsKept:
    """Around a recomputation (outside `inner`, selective's, which must see its ops only): BatchNorm's running
    statistics as they were before it."""

    NAMES = ("running_mean", "running_var", "num_batches_tracked")

    def __init__(self, norms: list[nn.Module], inner: Any) -> None:
        self.norms, self.inner = norms, inner

    def __enter__(self) -> None:
        self.saved = [[getattr(norm, name).clone() for name in self.NAMES] for norm in self.norms]
        self.inner.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)
        with torch.no_grad():
            for norm, values in zip(self.norms, self.saved, strict=True):
                for name, value in zip(self.NAMES, values, strict=True):
                    getattr(norm, name).copy_(value)


def _keep_costly_ops(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE
