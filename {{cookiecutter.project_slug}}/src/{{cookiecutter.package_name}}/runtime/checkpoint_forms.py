"""The forms a checkpoint's net and optimizer take under the presets, and each read as one device holds it, so that a
training resumes under any other preset (runtime/resuming.py says which changes are refused):

- whole (single, ddp, ddp_spawn, dp, model_parallel mode=layers): one process writes the whole net, and the optimizer
  state keyed by parameter name (`by_name`: torch numbers the parameters in its own state_dict, numbers that mean
  nothing to another layout);
- shards (fsdp, model_parallel): a torch.distributed.checkpoint (DCP) folder of every process's shards; the optimizer
  state keyed by parameter name, in torch.distributed.checkpoint.state_dict's nested form;
- stages (pipeline): a DCP folder of every stage's part; the optimizer state flattened, each entry keyed by the
  stage's name for its parameter (pipelining.STAGE_OPTIMIZER_STATE).

Every form names the net's entries as one device does. Read as one device's (`read_parts`, `nested`), the optimizer
state is {"state": {name: {...}}, "param_groups": [{..., "params": [names]}]}: what torch's set_optimizer_state_dict
loads into the net of any layout (whole, sharded, a stage), and what `by_position` turns into a plain optimizer's own.
"""

import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

# torch's own reading of a DCP folder into a state dict that does not exist yet, as format_utils.dcp_to_torch_save
# does it (which writes the result to a file); the public dcp.load fills a state dict of known entries only.
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.nn import Module
from torch.optim import Optimizer

from ..parallel.pipelining import single_device_name

WHOLE, SHARDS, STAGES = "whole", "shards", "stages"


def form_of(checkpoint: Path) -> str:
    """Which form `checkpoint` (a checkpoint file or folder, or the DCP folder of its parts) is in."""
    if not (checkpoint / ".metadata").is_file():
        return WHOLE
    saved = dcp.FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    flattened = any(".param_groups." in key and not key.split(".param_groups.")[1][0].isdigit() for key in saved)
    return STAGES if flattened else SHARDS


def read_parts(folder: Path) -> dict[str, Any]:
    """Everything a DCP folder holds, put together in this process (on the CPU, whatever the layout it was saved on).
    Its optimizer states as saved: `nested` makes them one device's."""
    state: dict[str, Any] = {}
    with warnings.catch_warnings():  # that it reads in one process: what no_dist asks for
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        reader = dcp.FileSystemReader(folder)
        _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def saved_entries(folder: Path) -> set[str]:
    """The entries a DCP folder holds, as its metadata names them (flattened: optimizer.state.net.head.weight.step)."""
    return set(dcp.FileSystemReader(folder).read_metadata().state_dict_metadata)


def drop_unsaved_state(state: dict[str, Any], saved: set[str], key: str) -> None:
    """Before DCP fills `state` (an optimizer's, keyed by parameter name, nested or flattened: torch's get_state_dict)
    from a checkpoint holding the entries `saved` (saved_entries), the optimizer's under `key`: drop the state of each
    parameter the checkpoint holds none for. torch's optimizers keep none for a parameter that never had a gradient
    (an auxiliary head the forward leaves out), where get_state_dict of an optimizer yet to step makes one for every
    parameter, which DCP would look for. A parameter saved with part of its state keeps its entries: DCP fails on
    the others, as on any entry the checkpoint lacks. load_optimizer_state then loads the state as saved."""
    holders = _prefixes(saved)
    if "state" in state:
        for name in [name for name in state["state"] if f"{key}.state.{name}" not in holders]:
            del state["state"][name]
        return
    unsaved = {f"state.{name}" for name in _flattened_names(state) if f"{key}.state.{name}" not in holders}
    for entry in [entry for entry in state if unsaved & _prefixes([entry])]:
        del state[entry]


def stateless(state: dict[str, Any]) -> set[str]:
    """The parameters an optimizer state keyed by name (nested or flattened) names in its groups without state."""
    if "state" in state:
        return {name for group in state["param_groups"] for name in group["params"]} - set(state["state"])
    holders = _prefixes(state)
    return {name for name in _flattened_names(state) if f"state.{name}" not in holders}


def load_optimizer_state(
    net: Module, optimizer: Optimizer, state: dict[str, Any], options: StateDictOptions | None = None
) -> None:
    """torch's set_optimizer_state_dict, for a state keyed by parameter name (nested or flattened) without state for
    some parameters its groups name (`stateless`: torch's optimizers keep none for a parameter that never had a
    gradient). Those end without state, as in the training that saved it: torch's loading asks one of each parameter
    (strict) and keeps, for one it finds none of, the optimizer's own (the zeros get_state_dict makes before a first
    step; the flattened form reads which entries to take from it). Any other parameter missing still fails."""
    missing = stateless(state) if not is_numbered(state) else set()
    unsaved = [param for name, param in net.named_parameters(remove_duplicate=False) if _fqn(name) in missing]
    for param in unsaved:
        optimizer.state.pop(param, None)
    if "state" in state and missing:  # an empty state: what torch's optimizers hold for a parameter before its step
        state = {**state, "state": {**state["state"], **{name: {} for name in missing}}}
    set_optimizer_state_dict(net, optimizer, state, options=options)
    for param in unsaved:
        optimizer.state.pop(param, None)


def _fqn(name: str) -> str:
    """A parameter's name as torch's state-dict functions give it: without torch.compile's wrapper (_orig_mod)."""
    return name.replace("_orig_mod.", "")


def _prefixes(keys: Iterable[str]) -> set[str]:
    """Every dotted prefix of `keys` (a.b.c: a, a.b)."""
    parts = [key.split(".") for key in keys]
    return {".".join(split[:i]) for split in parts for i in range(1, len(split))}


def _flattened_names(state: dict[str, Any]) -> set[str]:
    """The parameters a flattened optimizer state names: each has its hyperparameters (param_groups.<name>.lr)."""
    return {key.removeprefix("param_groups.").rpartition(".")[0] for key in state if key.startswith("param_groups.")}


def nested(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name, flattened (a pipeline stage's, names of the stage) or nested, as
    one device's nested one. Flattened entries carry each parameter's hyperparameters: parameters with the same ones
    form a group (the groups of one device: weight decay or none)."""
    if "state" in state:
        return state
    per_param: dict[str, dict[str, dict[str, Any]]] = {"state": {}, "param_groups": {}}
    for key, value in state.items():
        kind, _, entry = key.partition(".")
        name, _, field = entry.rpartition(".")
        per_param[kind].setdefault(single_device_name(name), {})[field] = value
    groups: dict[str, dict[str, Any]] = {}
    for name, hyperparameters in per_param["param_groups"].items():
        same = repr(sorted(hyperparameters.items()))
        groups.setdefault(same, {**hyperparameters, "params": []})["params"].append(name)
    return {"state": per_param["state"], "param_groups": list(groups.values())}


def stage_state(
    state: dict[str, Any], names: dict[str, str], aliases: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """A `nested` state cut to a pipeline stage's parameters, under the stage's names (`names`: single-device name ->
    the stage's). `aliases`: the other single-device names of a tied parameter the stage holds under one (its head, the
    embedding's matrix), under any of which torch may have saved its state (one name per parameter: FSDP's)."""
    saved_as = {}
    for name in names:
        saved_as[name] = next(
            (other for other in [name, *(aliases or {}).get(name, [])] if other in state["state"]), name
        )
    entries, taken = {}, set()
    for name, saved in saved_as.items():
        if saved in state["state"]:  # two copies of a tied parameter (zbv: one process, two stages) step apart:
            entry = state["state"][saved]  # each its own state, not one entry's tensors
            entries[names[name]] = {key: value.clone() for key, value in entry.items()} if id(entry) in taken else entry
            taken.add(id(entry))
    group_of = {name: i for i, group in enumerate(state["param_groups"]) for name in group["params"]}
    groups = [{**group, "params": []} for group in state["param_groups"]]
    for name, saved in saved_as.items():
        if saved in group_of:
            groups[group_of[saved]]["params"].append(names[name])
    return {"state": entries, "param_groups": groups}


def by_name(state: dict[str, Any], optimizer: Optimizer, names: dict[torch.Tensor, list[str]]) -> dict[str, Any]:
    """`optimizer`'s own state_dict (`state`, its parameters numbered) keyed by parameter name; `names`: each
    parameter's names (a tied parameter has several; its state is written under each, so that a layout holding it
    under another name, a pipeline's last stage its head, finds it)."""
    if not is_numbered(state):
        return state  # keyed by name already (a preset that shards the net or cuts it into stages)
    numbered = [names[param] for group in optimizer.param_groups for param in group["params"]]
    groups = [
        {**group, "params": [name for i in group["params"] for name in numbered[i]]} for group in state["param_groups"]
    ]
    entries = {name: entry for i, entry in state["state"].items() for name in numbered[i]}
    return {"state": entries, "param_groups": groups}


def by_position(state: dict[str, Any], optimizer: Optimizer, names: dict[torch.Tensor, list[str]]) -> dict[str, Any]:
    """A state keyed by parameter name as `optimizer`'s own state_dict (its parameters numbered in its groups' order);
    a numbered state as it is. Each group takes the hyperparameters saved with its parameters."""
    if is_numbered(state):
        return state
    saved_group = {name: group for group in state["param_groups"] for name in group["params"]}
    entries, groups, position = {}, [], 0
    for group in optimizer.param_groups:
        numbers = []
        for param in group["params"]:
            name = next((name for name in names[param] if name in saved_group), None)
            if name is None:
                raise KeyError(f"the checkpoint has no optimizer state for parameter {names[param][0]}")
            if name in state["state"]:
                entries[position] = state["state"][name]
            numbers.append(position)
            position += 1
        saved = saved_group[names[group["params"][0]][0]] if group["params"] else group
        groups.append({**{key: value for key, value in saved.items() if key != "params"}, "params": numbers})
    return {"state": entries, "param_groups": groups}


def is_numbered(state: dict[str, Any]) -> bool:
    """Whether an optimizer state is torch's own, its parameters numbered (not keyed by name, nor flattened)."""
    params = [param for group in state.get("param_groups", []) for param in group["params"]]
    return bool(params) and isinstance(params[0], int)


def restore_hyperparameters(optimizer: Optimizer, state: dict[str, Any], names: dict[torch.Tensor, list[str]]) -> None:
    """Give each of `optimizer`'s groups the hyperparameters `state` (`nested`) saved with its parameters. torch's
    loading matches a saved group to the optimizer's groups by their parameters, and of two groups that a stage's
    flattened state merged (the same hyperparameters then: a weight decay of 0 for both, say) fills one only: the
    other would keep the learning rate it was built with, which a chained schedule then carries on."""
    saved = {name: group for group in state["param_groups"] for name in group["params"]}
    for group in optimizer.param_groups:
        name = next((name for param in group["params"] for name in names[param] if name in saved), None)
        if name is not None:
            group.update({key: value for key, value in saved[name].items() if key != "params"})


def one_name_each(state: dict[str, Any], names: dict[torch.Tensor, list[str]]) -> dict[str, Any]:
    """A `nested` optimizer state with each tied parameter under one name, its first in `names` (the one torch's
    state-dict functions give it): a whole-model preset's holds it under each of its names (by_name), a pipeline
    stage's under the stage's, and torch's full-state loading into a sharded net fails on any other (KeyError)."""
    first = {name: tied[0] for tied in names.values() for name in tied}
    entries: dict[str, Any] = {}
    for name, entry in state["state"].items():
        entries.setdefault(first.get(name, name), entry)
    groups = [
        {**group, "params": list(dict.fromkeys(first.get(name, name) for name in group["params"]))}
        for group in state["param_groups"]
    ]
    return {"state": entries, "param_groups": groups}


def fill_tied(model: dict[str, torch.Tensor], names: dict[torch.Tensor, list[str]]) -> None:
    """Give `model` (a net's state by name) every name of each tied parameter (`names`: each parameter's): a whole-model
    file that safetensors wrote (Accelerate's) holds it under one."""
    for tied in names.values():
        present = next((name for name in tied if name in model), None)
        if present is not None:
            model.update({name: model[present] for name in tied if name not in model})


def parameter_names(named: Iterable[tuple[str, torch.Tensor]]) -> dict[torch.Tensor, list[str]]:
    """Each parameter's names (`named`: named_parameters(remove_duplicate=False)), the first as the optimizer's."""
    names: dict[torch.Tensor, list[str]] = {}
    for name, param in named:
        names.setdefault(param, []).append(name)
    return names


def accept_state_by_name(optimizer: Optimizer, names: Callable[[], dict[torch.Tensor, list[str]]]) -> None:
    """Let `optimizer.load_state_dict` take a state keyed by parameter name (a checkpoint of another preset's, or of a
    whole-model one: by_name) as well as its own numbered one. `names` is asked when a state is loaded: the
    parameters' names then (a strategy may wrap the net after the optimizer was built)."""
    optimizer.register_load_state_dict_pre_hook(lambda opt, state: by_position(state, opt, names()))


def keep_state_by_name(optimizer: Optimizer, names: Callable[[], dict[torch.Tensor, list[str]]]) -> None:
    """`optimizer.state_dict()` keyed by parameter name (by_name), and `load_state_dict` taking it: a whole-model
    preset's optimizer state as every preset reads it (Lightning's whole-model presets key theirs when the
    checkpoint is assembled instead: engine/module.py)."""
    optimizer.register_state_dict_post_hook(lambda opt, state: by_name(state, opt, names()))
    accept_state_by_name(optimizer, names)
