"""The checkpoint folder of the presets whose processes each hold a part of the model (model_parallel, fsdp, pipeline),
as Lightning's ModelParallelStrategy writes it: every process's parameters and optimizer state by
torch.distributed.checkpoint, the rest (loop counters, callbacks, random states) in meta.pt by the first process.
Written here too so that checkpoint.async=true can write the parts in the background (runtime/async_saves.py). And
any preset's checkpoint read whole, as one device's, for a training that resumes under another preset."""

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
)

from ...errors import ConfigError
from ...runtime.async_saves import CheckpointWriter
from ...runtime.checkpoint_forms import (
    WHOLE,
    drop_unsaved_state,
    form_of,
    is_numbered,
    load_optimizer_state,
    nested,
    one_name_each,
    parameter_names,
    read_parts,
    restore_hyperparameters,
    saved_entries,
)

META = "meta.pt"  # what Lightning's ModelParallelStrategy names the non-tensor part of its checkpoint folders


def write_parts(checkpoint: dict[str, Any], path: Path, writer: CheckpointWriter, first_process: bool) -> None:
    """Write `checkpoint` (Lightning's dict; its state_dict and optimizer_states are this process's parts) into the
    folder `path`. Every process calls it."""
    if first_process and path.is_file():  # a whole-model checkpoint of that name, from another preset
        path.unlink()
    if dist.is_initialized():  # no process makes the folder before the file is gone (seen: both unlinked it)
        dist.barrier()
    path.mkdir(parents=True, exist_ok=True)
    parts = {"state_dict": checkpoint.pop("state_dict")}
    parts.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
    writer.write(parts, path)
    if first_process:
        torch.save(checkpoint, path / META)


def load_parts(
    path: Path, module: nn.Module, optimizers: list[torch.optim.Optimizer], strict: bool, weights_only: bool | None
) -> dict[str, Any]:
    """Load the folder `path` (write_parts') into a sharded `module` and its optimizers, each process reading its
    shards in place; returns the rest (meta.pt). As Lightning's ModelParallelStrategy loads it, but the optimizer
    state of a parameter that never had a gradient (which torch's optimizers keep none of) neither asked for nor
    made up: the parameter ends without state, as saved (checkpoint_forms.load_optimizer_state)."""
    net = {"state_dict": get_model_state_dict(module)}
    dcp.load(net, checkpoint_id=path)
    module.load_state_dict(net["state_dict"], strict=strict)
    saved = saved_entries(path)
    for i, optimizer in enumerate(optimizers):
        key = f"optimizer_{i}"
        state = {key: get_optimizer_state_dict(module, optimizer)}
        drop_unsaved_state(state[key], saved, key)
        dcp.load(state, checkpoint_id=path)
        load_optimizer_state(module, optimizer, state[key], StateDictOptions(cpu_offload=True))
    return torch.load(path / META, weights_only=weights_only)


def read_whole(path: Path, weights_only: bool | None = None) -> dict[str, Any]:
    """The checkpoint of any preset (a whole-model file, or a folder of parts) as Lightning's dict of one device: the
    net by its single-device names, each optimizer's state keyed by parameter name (checkpoint_forms.nested)."""
    if form_of(path) == WHOLE:
        checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
    else:
        parts = read_parts(path)
        checkpoint = torch.load(path / META, map_location="cpu", weights_only=weights_only)
        checkpoint["state_dict"] = parts.pop("state_dict")
        if parts:  # not in weights-only checkpoints
            checkpoint["optimizer_states"] = [parts[f"optimizer_{i}"] for i in range(len(parts))]
    if "optimizer_states" in checkpoint:
        checkpoint["optimizer_states"] = [nested(state) for state in checkpoint["optimizer_states"]]
    return checkpoint


def check_named(states: list[dict[str, Any]]) -> None:
    """Refuse, in one line, to restore an optimizer state another preset wrote numbered (as torch numbers it: before
    checkpoints named each parameter's): its numbers mean nothing to this layout. Its weights alone load."""
    if any(is_numbered(state) for state in states):
        raise ConfigError(
            "the checkpoint numbers its optimizer state (written before checkpoints named each parameter's): it "
            "resumes under the preset that wrote it only"
        )


def load_whole(module: nn.Module, optimizers: list[torch.optim.Optimizer], checkpoint: dict[str, Any]) -> None:
    """Load a checkpoint read whole (read_whole) into a sharded `module` and its optimizers: each process keeps its
    shards of every entry (torch.distributed.checkpoint.state_dict's full-state loading)."""
    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, checkpoint.pop("state_dict"), options=full)
    states = checkpoint.pop("optimizer_states", []) if optimizers else []
    check_named(states)
    names = parameter_names(module.named_parameters(remove_duplicate=False))
    for optimizer, state in zip(optimizers, states, strict=False):
        load_optimizer_state(module, optimizer, one_name_each(state, names), full)
        restore_hyperparameters(optimizer, state, names)
