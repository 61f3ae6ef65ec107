"""The engine-neutral pipeline pieces: the bubble formula, whole-model names of a stage's parameters, the layout of
pipelines side by side."""

import pytest

from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.pipelining import (
    PipelinedNet,
    PipelineLayout,
    bubble_fraction,
    check_pipeline,
    single_device_name,
)


@pytest.mark.parametrize("stages, microbatches, expected", [(2, 4, 0.2), (2, 8, 1 / 9), (4, 4, 3 / 7)])
def test_bubble_fraction_follows_the_formula(stages, microbatches, expected):
    assert bubble_fraction(stages, microbatches) == pytest.approx(expected)


def test_stage_parameters_keep_their_single_device_names():
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    stages = [PipelinedNet.of(net, rank, 2) for rank in range(2)]
    names = [{single_device_name(name) for name in stage.state_dict()} for stage in stages]
    assert names[0].isdisjoint(names[1]) and names[0] | names[1] == set(net.state_dict())
    assert single_device_name("net.stage.blocks.2.fc_in.weight") == "net.blocks.2.fc_in.weight"


def test_pipelines_side_by_side_are_checked_before_training():
    """strategy.data_parallel_size=D: D pipelines of processes / D stages, each splitting 1/D of the batch into
    micro-batches; a layout that does not divide is refused naming each factor."""
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    check_pipeline(4, 4, 64, net, None, replicas=2)
    with pytest.raises(ConfigError, match=r"data_parallel_size=3 must divide the 4 processes .*valid: 1, 2, 4"):
        check_pipeline(4, 4, 64, net, None, replicas=3)
    with pytest.raises(ConfigError, match="data_parallel_size=2 over 2 processes leaves 1 stage per pipeline"):
        check_pipeline(2, 4, 64, net, None, replicas=2)
    with pytest.raises(ConfigError, match="micro-batches for each of 2 pipelines; use a multiple of 8"):
        check_pipeline(4, 4, 36, net, None, replicas=2)
    stage = PipelinedNet.of(net, 3, 4)  # one pipeline of 4 stages: process 3 holds the last
    assert (stage.index, stage.replica, stage.ranks) == (3, 0, [0, 1, 2, 3])


def test_the_layout_maps_every_rank_to_one_stage_of_one_pipeline():
    """2 pipelines of 3 stages over 6 processes: a pipeline's stages are neighbouring ranks, each stage's copies
    one per pipeline; every rank is exactly one (pipeline, stage)."""
    layout = PipelineLayout.over(6, replicas=2)
    assert (layout.stages, layout.replicas) == (3, 2)
    assert [layout.pipeline_ranks(pipeline) for pipeline in range(2)] == [[0, 1, 2], [3, 4, 5]]
    assert [layout.stage_ranks(stage) for stage in range(3)] == [[0, 3], [1, 4], [2, 5]]
    assert layout.pipeline_ranks(1, stages=[0, 2]) == [3, 5]  # a tied weight's holders in pipeline 1
    assert all(layout.rank(layout.pipeline_of(r), layout.stage_of(r)) == r for r in range(6))
