"""The engine-neutral pipeline pieces: the bubble formula, whole-model names of a stage's parameters, the layout of
pipelines side by side and of the looped schedules' several stages per process."""

import pytest

from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.pipelining import (
    PipelinedNet,
    PipelineLayout,
    bubble_fraction,
    check_pipeline,
    check_stages_per_process,
    single_device_name,
)


@pytest.mark.parametrize("stages, microbatches, expected", [(2, 4, 0.2), (2, 8, 1 / 9), (4, 4, 3 / 7)])
def test_bubble_fraction_follows_the_formula(stages, microbatches, expected):
    assert bubble_fraction(stages, microbatches) == pytest.approx(expected)


def test_a_looped_schedule_shrinks_the_bubble_by_its_stages_per_process():
    """(p - 1) / (V m + p - 1): 2 processes x 2 stages, 4 micro-batches fill like 8; zbv's premise leaves none."""
    assert bubble_fraction(2, 4, "interleaved_1f1b", 2) == pytest.approx(1 / 9)
    assert bubble_fraction(4, 8, "interleaved_1f1b", 3) == pytest.approx(3 / 27)
    assert bubble_fraction(2, 4, "zbv", 2) == 0.0


def test_looped_schedules_lay_several_stages_on_each_process():
    """interleaved_1f1b: stage s on position s % p; zbv: in a V, so position 0 holds the first and the last stage
    and computes the loss. Every stage is held once, and the net's parameters are each held by one process."""
    loop = PipelineLayout.over(2, 1, "interleaved_1f1b", 2)
    assert [loop.stages_at(position) for position in range(2)] == [[0, 2], [1, 3]] and loop.loss_position == 1
    vee = PipelineLayout.over(4, 2, "zbv", 2)  # 2 pipelines of 2 processes
    assert [vee.stages_at(position) for position in range(2)] == [[0, 3], [1, 2]] and vee.loss_position == 0
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    for schedule in ("interleaved_1f1b", "zbv"):
        stages = [PipelinedNet.of(net, rank, 2, schedule=schedule, per_process=2) for rank in range(2)]
        names = [{single_device_name(name) for name in stage.state_dict()} for stage in stages]
        assert names[0].isdisjoint(names[1]) and names[0] | names[1] == set(net.state_dict())
        assert all(len(stage.chunks) == 2 for stage in stages)
    assert check_stages_per_process("interleaved_1f1b", None) == 2 and check_stages_per_process("1f1b", None) == 1
    with pytest.raises(ValueError, match="strategy.stages_per_process=3 does not fit strategy.schedule=zbv; valid: 2"):
        check_stages_per_process("zbv", 3)
    check_pipeline(2, 6, 60, net, None, 1, "interleaved_1f1b", 2)  # 6 micro-batches in 3 rounds of 2
    with pytest.raises(ConfigError, match=r"in 5 // 2 = 2 equal rounds\); valid: 2, 3, 4, 6, 8, ..."):
        check_pipeline(2, 5, 60, net, None, 1, "interleaved_1f1b", 2)
    with pytest.raises(ConfigError, match=r"6 blocks; the model has 4 \(2 processes x strategy.stages_per_process=3\)"):
        check_pipeline(2, 4, 64, net, None, 1, "interleaved_1f1b", 3)


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


def test_tensor_parallelism_inside_the_stages_is_the_layouts_third_dimension():
    """2 pipelines x 2 stages x 2 shards over 8 processes, one DeviceMesh (data_parallel, pipeline, tensor_parallel):
    a stage's shards on neighbouring ranks, then a pipeline's stages; sizes that do not fit are refused naming each
    factor, and a plan that does not divide over the shards as model_parallel refuses it."""
    layout = PipelineLayout.over(8, replicas=2, tensor_parallel=2)
    assert layout.stages == 2
    assert [(layout.pipeline_of(r), layout.stage_of(r), layout.tensor_rank_of(r)) for r in (0, 1, 2, 5, 7)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)
    ]  # fmt: skip
    assert layout.pipeline_ranks(1, tensor_rank=1) == [5, 7] and layout.stage_ranks(1, tensor_rank=0) == [2, 6]
    assert all(layout.rank(layout.pipeline_of(r), layout.stage_of(r), layout.tensor_rank_of(r)) == r for r in range(8))
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    check_pipeline(8, 4, 64, net, None, replicas=2, tensor_parallel=2)
    with pytest.raises(ConfigError, match=r"data_parallel_size=2 x strategy.tensor_parallel_size=2 must divide the 6"):
        check_pipeline(6, 4, 64, net, None, replicas=2, tensor_parallel=2)
    with pytest.raises(ConfigError, match="over 4 processes leaves 1 stage per pipeline; use 8\\+ processes"):
        check_pipeline(4, 4, 64, net, None, replicas=2, tensor_parallel=2)
    with pytest.raises(ConfigError, match="strategy.tensor_parallel_size=3 does not divide"):
        check_pipeline(6, 4, 64, net, None, tensor_parallel=3)
