"""The optimizer state of every checkpoint form read as one device's (runtime/checkpoint_forms.py), in one process: a
whole-model preset's, keyed by name, and a pipeline stage's, flattened under the stage's names, both load into an
optimizer of another layout with every entry where it was. (Across presets, with real trainings:
test_resume_layouts.py.)"""

import copy
import functools

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from {{ cookiecutter.package_name }}.parallel.pipelining import STAGE_OPTIMIZER_STATE
from {{ cookiecutter.package_name }}.runtime.checkpoint_forms import (
    accept_state_by_name,
    by_name,
    by_position,
    nested,
    one_name_each,
    parameter_names,
    restore_hyperparameters,
    stage_state,
)
from {{ cookiecutter.package_name }}.runtime.optimization import grouped_optimizer

AdamW = functools.partial(torch.optim.AdamW, lr=0.1, weight_decay=0.1)


class Tied(nn.Module):
    """Weight matrices, norms and biases (two parameter groups), and a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.norm = nn.LayerNorm(4)
        self.hidden = nn.Linear(4, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(self.norm(self.embed(x))))


def trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = Tied()
    optimizer = grouped_optimizer(AdamW, net.parameters(), no_decay_norms_and_biases=True)
    for _ in range(2):
        net(torch.tensor([[1, 2, 3]])).sum().backward()
        optimizer.step()
    return net, optimizer


def assert_same_state(optimizer: torch.optim.Optimizer, expected: torch.optim.Optimizer) -> None:
    got, want = optimizer.state_dict(), expected.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for position, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.equal(got["state"][position][key], value), (position, key)


def test_a_state_keyed_by_name_loads_into_the_optimizer_of_another_build():
    net, optimizer = trained()
    names = parameter_names(net.named_parameters(remove_duplicate=False))
    saved = by_name(optimizer.state_dict(), optimizer, names)
    # Each name of the tied parameter carries its state: a stage that holds the head alone finds it.
    assert torch.equal(saved["state"]["head.weight"]["exp_avg"], saved["state"]["embed.weight"]["exp_avg"])
    assert {"embed.weight", "head.weight", "hidden.weight"} == set(saved["param_groups"][0]["params"])
    fresh = grouped_optimizer(AdamW, net.parameters(), no_decay_norms_and_biases=True)
    accept_state_by_name(fresh, lambda: names)
    fresh.load_state_dict(copy.deepcopy(saved))
    assert_same_state(fresh, optimizer)
    fresh.load_state_dict(optimizer.state_dict())  # its own numbered state as well
    assert_same_state(fresh, optimizer)
    assert by_position(saved, fresh, names)["param_groups"] == optimizer.state_dict()["param_groups"]
    # One process running both stages that use the tied matrix (zbv) holds a copy for each: each its own state.
    stage = stage_state(saved, {"embed.weight": "stage.embed.weight", "head.weight": "stage.head.weight"})
    embed, head = (stage["state"][f"stage.{name}.weight"]["exp_avg"] for name in ("embed", "head"))
    assert torch.equal(embed, head) and embed.data_ptr() != head.data_ptr()


def test_a_missing_parameter_is_named():
    net, optimizer = trained()
    names = parameter_names(net.named_parameters(remove_duplicate=False))
    saved = by_name(optimizer.state_dict(), optimizer, names)
    for group in saved["param_groups"]:
        group["params"] = [name for name in group["params"] if name != "norm.bias"]
    with pytest.raises(KeyError, match="no optimizer state for parameter norm.bias"):
        by_position(saved, optimizer, names)


def test_a_stage_state_reads_as_one_devices_and_back_as_a_stage():
    """A stage's flattened state under its names ("stage.hidden.weight") is one device's once `nested`; cut to another
    stage's parameters, it loads there."""
    net, optimizer = trained()
    stage = nn.Module()
    stage.stage = net  # a pipeline stage's names: stage.<the single-device name>
    flattened = get_optimizer_state_dict(stage, optimizer, options=STAGE_OPTIMIZER_STATE)
    assert "state.stage.hidden.weight.exp_avg" in flattened
    whole = nested(flattened)
    assert "hidden.weight" in whole["state"] and len(whole["param_groups"]) == 2  # weight decay, and none
    fresh = grouped_optimizer(AdamW, net.parameters(), no_decay_norms_and_biases=True)
    names = {name.removeprefix("stage."): name for name, _ in stage.named_parameters()}
    set_optimizer_state_dict(stage, fresh, stage_state(whole, names))
    assert_same_state(fresh, optimizer)


def test_groups_a_stage_state_merged_get_their_own_hyperparameters_back():
    """With a weight decay of 0 the two groups have the same hyperparameters, and a stage's flattened state, which
    keeps them per parameter, reads as one group: torch's loading fills one of the optimizer's two groups from it, so
    each group is given its parameters' saved values again (the other kept its built learning rate)."""
    net, optimizer = trained()
    for group in optimizer.param_groups:
        group.update(weight_decay=0.0, lr=0.05)  # where a schedule had brought it
    stage = nn.Module()
    stage.stage = net
    whole = nested(get_optimizer_state_dict(stage, optimizer, options=STAGE_OPTIMIZER_STATE))
    assert len(whole["param_groups"]) == 1
    fresh = grouped_optimizer(AdamW, net.parameters(), no_decay_norms_and_biases=True)  # lr 0.1, weight decay 0.1
    restore_hyperparameters(fresh, whole, parameter_names(net.named_parameters(remove_duplicate=False)))
    assert [(group["lr"], group["weight_decay"]) for group in fresh.param_groups] == [(0.05, 0.0), (0.05, 0.0)]


@pytest.mark.parametrize("saved_under", ["every name", "the head's"])
def test_a_tied_parameters_state_loads_into_a_sharded_net(saved_under):
    """A whole-model checkpoint keeps a tied parameter's state under each of its names, a pipeline's last stage
    under the head's only; torch's full-state loading into an FSDP net (strategy=fsdp or model_parallel continuing
    it) takes it under the name it gives the parameter alone (KeyError 'state.head.weight.step' otherwise)."""
    net, optimizer = trained()
    names = parameter_names(net.named_parameters(remove_duplicate=False))
    saved = by_name(optimizer.state_dict(), optimizer, names)
    if saved_under == "the head's":
        del saved["state"]["embed.weight"]
        for group in saved["param_groups"]:
            group["params"] = [name for name in group["params"] if name != "embed.weight"]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = copy.deepcopy(net)
        fully_shard(sharded)
        fresh = grouped_optimizer(AdamW, sharded.parameters(), no_decay_norms_and_biases=True)
        state = one_name_each(saved, names)
        set_optimizer_state_dict(sharded, fresh, state, options=StateDictOptions(full_state_dict=True))
        full = get_optimizer_state_dict(sharded, fresh, options=StateDictOptions(full_state_dict=True))
    finally:
        dist.destroy_process_group()
    tied = saved["state"]["head.weight"]
    assert torch.equal(full["state"]["embed.weight"]["exp_avg"], tied["exp_avg"]) and "head.weight" not in full["state"]
    assert torch.equal(full["state"]["hidden.weight"]["exp_avg_sq"], saved["state"]["hidden.weight"]["exp_avg_sq"])
