"""model_parallel in this one process: the net is built on the meta device, and each rank allocates only its
shards, with the values strategy=single draws. Two ranks are made by torch's fake process group (collectives
that move no data), enough for the mesh and the sharding; the real runs are test_presets.py's."""

from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore  # torch's one-process stand-in for N ranks

from {{ cookiecutter.package_name }}.engine.strategies import Strategy
from {{ cookiecutter.package_name }}.engine.strategies.model_parallel import ModelParallel
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP


@pytest.fixture
def rank1_of_2():
    dist.init_process_group("fake", rank=1, world_size=2, store=FakeStore())
    yield
    dist.destroy_process_group()


def test_each_tensor_parallel_rank_allocates_only_its_shards_with_singles_values(rank1_of_2, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    strategy = ModelParallel()
    strategy.processes(launched=2, devices=2)  # one node: a tensor-parallel group of 2
    build = partial(ResidualMLP, in_features=32, num_classes=8, hidden=16, depth=2)
    torch.manual_seed(0)
    expected = build().state_dict()
    torch.manual_seed(0)
    net = strategy.build_net(build)
    assert all(param.is_meta for param in net.parameters()), "nothing allocated before sharding"
    accelerator = SimpleNamespace(device=torch.device("cpu"))
    model, _ = strategy.prepare(accelerator, net, partial(torch.optim.AdamW, lr=1e-3))
    sharded = 0
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param.detach()
        full = expected[name]
        if isinstance(param, DTensor) and param.placements[0].is_shard():  # rank 1's half of the whole
            sharded += 1
            full = full.chunk(2, dim=param.placements[0].dim)[1]
        assert torch.equal(local, full), name
    assert sharded == 2 * 3, "each block's fc_in weight and bias, and fc_out weight"


def test_a_checkpoint_folder_without_its_net_is_refused_and_told_from_a_layer_mode_one(tmp_path):
    """A layer-mode checkpoint was recognised by what it lacks (model.safetensors, sharded/): a copy cut short of
    any preset's was called one ("resumes under that preset only") or reached accelerate's traceback."""
    net = ResidualMLP(8, 2, hidden=8, depth=1).state_dict()
    layers, cut = tmp_path / "step-0000004", tmp_path / "step-0000008"
    for folder, state in ((layers, {"model": net, "optimizer": {"state": {}}}), (cut, {"base_lrs": [0.1]})):
        folder.mkdir()
        torch.save({"global_step": 4}, folder / "custom_checkpoint_0.pkl")
        torch.save(state, folder / "custom_checkpoint_1.pkl")  # the layer mode's net, or another preset's schedule
    with pytest.raises(ConfigError, match="was saved by strategy=model_parallel strategy.mode=layers"):
        Strategy().check_resume(layers, 1)
    with pytest.raises(ConfigError, match=r"step-0000008 holds no net: neither model.safetensors nor sharded/"):
        Strategy().check_resume(cut, 1)
