"""The engine-neutral pipeline pieces: the bubble formula and whole-model names of a stage's parameters."""

import pytest

from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.pipelining import PipelinedNet, bubble_fraction, single_device_name


@pytest.mark.parametrize("stages, microbatches, expected", [(2, 4, 0.2), (2, 8, 1 / 9), (4, 4, 3 / 7)])
def test_bubble_fraction_follows_the_formula(stages, microbatches, expected):
    assert bubble_fraction(stages, microbatches) == pytest.approx(expected)


def test_stage_parameters_keep_their_single_device_names():
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    stages = [PipelinedNet.of(net, rank, 2) for rank in range(2)]
    names = [{single_device_name(name) for name in stage.state_dict()} for stage in stages]
    assert names[0].isdisjoint(names[1]) and names[0] | names[1] == set(net.state_dict())
    assert single_device_name("net.stage.blocks.2.fc_in.weight") == "net.blocks.2.fc_in.weight"
