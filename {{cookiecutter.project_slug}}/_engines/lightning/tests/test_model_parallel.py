"""model_parallel: tensor-parallel ranks hold only their shards, checkpoints of both modes reload to the
same predictions, layer placement survives Lightning's move to the root device."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import PARITY, QUICK, make_runner
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from {{ cookiecutter.package_name }}.data.synthetic import SyntheticData
from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.engine.module import Classifier
from {{ cookiecutter.package_name }}.engine.strategies.model_parallel import LayerSplitStrategy
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.split import Split, layer_groups, register_split

TOLERANCE = 1e-5
# One epoch of 4 steps, then validation, then the checkpoint (so best = last = the validated weights).
SHORT = [*QUICK, "trainer.limit_train_batches=4", "data.batch_size=64", "data.shuffle=false", "trainer.accelerator=cpu"]
TENSOR = ["strategy=model_parallel", "trainer.devices=2"]
LAYERS = ["strategy=model_parallel", "strategy.mode=layers", "strategy.devices=[cpu,cpu]"]
SHARDED = ("fc_in.weight", "fc_in.bias", "fc_out.weight")  # fc_out's bias is added once, after the all-reduce


def loss_on(state_dict: dict[str, torch.Tensor], split: str) -> float:
    """The loss of checkpointed weights on a whole split, computed here on one device, no Lightning."""
    net = ResidualMLP(in_features=32, num_classes=8)  # the sizes of configs/model/classifier.yaml
    net.load_state_dict({name.removeprefix("net."): value for name, value in state_dict.items()})
    x, y = SyntheticData(split, seed=42).tensors  # the seed in configs/train.yaml
    with torch.no_grad():
        return F.cross_entropy(net(x), y).item()


@pytest.fixture(scope="module")
def tensor_run(tmp_path_factory, train_env):
    """Tensor parallel over 2 processes, a sharded checkpoint, and a test pass that reloads it."""
    train = make_runner(tmp_path_factory.mktemp("tensor"), train_env)
    return train(*SHORT, *TENSOR, "test_after_fit=true", "+callbacks.probe._target_=shard_probe.ShardProbe")


@pytest.mark.slow
def test_each_tensor_parallel_rank_holds_only_its_shard(tensor_run):
    for rank in (0, 1):
        counts = json.loads((tensor_run.run_dir / f"shards-rank{rank}.json").read_text())
        # Built on the meta device: no parameter existed at full size before sharding (parity with single,
        # which the parity tests check, shows the shards got single's values).
        assert counts.pop("allocated_before_sharding") == []
        sharded = [name for name in counts if name.endswith(SHARDED)]
        assert len(sharded) == 4 * len(SHARDED), sorted(counts)
        for name, count in counts.items():
            expected = count["total"] // 2 if name in sharded else count["total"]
            assert count["local"] == expected, (rank, name, count)


@pytest.mark.slow
def test_sharded_checkpoint_reloads_to_the_same_predictions(tensor_run, tmp_path):
    checkpoint = tensor_run.run_dir / "checkpoints" / "last.ckpt"
    assert checkpoint.is_dir(), "one folder of per-rank shards"
    dcp_to_torch_save(checkpoint, tmp_path / "full.pt")  # consolidate, as a user would to deploy
    weights = torch.load(tmp_path / "full.pt", weights_only=True)["state_dict"]
    wandb = tensor_run.wandb
    # val/loss was measured by the sharded model before saving; test/loss after Lightning reloaded the shards.
    assert loss_on(weights, "val") == pytest.approx(wandb.metric("val/loss")[-1], abs=TOLERANCE)
    assert loss_on(weights, "test") == pytest.approx(wandb.metric("test/loss")[-1], abs=TOLERANCE)
    assembled = load_trained(checkpoint).state_dict()  # what a user evaluating the run does, without consolidating
    assert assembled.keys() == weights.keys()
    assert all(torch.equal(assembled[name], value) for name, value in weights.items())


@pytest.mark.slow
def test_resume_from_shards(tensor_run, train):
    resumed = train(*SHORT, *TENSOR, "trainer.max_epochs=2", f"ckpt_path={tensor_run.run_dir}")  # (its last)
    assert resumed.wandb.steps("train/loss") == [4, 5, 6, 7], "the global step continues from the checkpoint"
    weights = load_trained(resumed.run_dir).state_dict()
    assert loss_on(weights, "val") == pytest.approx(resumed.wandb.metric("val/loss")[-1], abs=TOLERANCE)


@pytest.mark.slow
def test_layers_checkpoint_reloads_to_the_same_predictions(train):
    run = train(*SHORT, *LAYERS, "test_after_fit=true")
    weights = torch.load(run.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert loss_on(weights, "val") == pytest.approx(run.wandb.metric("val/loss")[-1], abs=TOLERANCE)
    assert loss_on(weights, "test") == pytest.approx(run.wandb.metric("test/loss")[-1], abs=TOLERANCE)


def test_layer_groups_cover_the_model_once_in_order():
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    for n in (1, 2, 3, 4):
        groups = layer_groups(net, n)
        assert len(groups) == n and all(groups)
        assert [module for group in groups for module in group] == [net.embed, *net.blocks, net.norm, net.head]
    with pytest.raises(ValueError, match="cannot split 4 blocks over 5 devices"):
        layer_groups(net, 5)
    with pytest.raises(ValueError, match="the Split of NoBlocks names no blocks, which model_parallel's strategy"):
        layer_groups(NoBlocks(torch.nn.Linear(32, 8)), 2)  # ("cannot split 0 blocks over 2 devices; valid: 1 to 0")


class NoBlocks(torch.nn.Sequential):
    """A net whose Split names its layers first and last, and no blocks."""


register_split(NoBlocks, Split(blocks=[], first=["0"]))


def test_layer_placement_survives_lightnings_move_to_the_root_device():
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    strategy = LayerSplitStrategy(["cpu", "meta"])  # "meta" stands in for a second GPU: no memory, no GPU
    strategy.model = Classifier(net, optimizer=torch.optim.AdamW)
    strategy.model_to_device()  # Lightning's call at setup: move the module to the root device (cpu)
    first = [net.embed, net.blocks[0], net.blocks[1]]
    second = [net.blocks[2], net.blocks[3], net.norm, net.head]
    assert {p.device.type for module in first for p in module.parameters()} == {"cpu"}
    assert {p.device.type for module in second for p in module.parameters()} == {"meta"}


# Plain SGD, so that clipping changes the update in proportion (Adam's update hardly depends on the scale).
CLIPPED_SGD = ["model.optimizer._target_=torch.optim.SGD", "model.optimizer.lr=0.1", "trainer.gradient_clip_val=0.05"]


@pytest.mark.slow
def test_gradient_clipping_uses_the_norm_of_the_whole_gradient(train):
    """Tensor parallel + gradient_clip_val: the norm is over every shard (and the plain parameters), so the
    clipped weights equal single's; torch's clip_grad_norm_ cannot even mix shards and plain tensors."""
    clipped = [*PARITY, *CLIPPED_SGD, "trainer.max_steps=4"]
    single = train(*clipped, "strategy=single")
    sharded = train(*clipped, *TENSOR)
    expected = torch.load(single.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    got = load_trained(sharded.run_dir).state_dict()
    unclipped = train(*(o for o in clipped if "clip" not in o), "strategy=single")
    free = torch.load(unclipped.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert not all(torch.allclose(free[name], value, atol=1e-4) for name, value in expected.items()), "no clipping"
    for name, value in expected.items():
        assert torch.allclose(got[name], value, atol=TOLERANCE), name


@pytest.mark.slow
def test_shards_are_not_resumed_on_another_mesh(tensor_run, train):
    """Tensor parallel over 2 processes -> FSDP over 2: the optimizer's parameter groups follow the mesh, so its
    saved state would load into the wrong groups (KeyError 'betas' at the first step). Refused before training."""
    fsdp = ["strategy.data_parallel_size=2", "strategy.tensor_parallel_size=1"]
    last = tensor_run.run_dir / "checkpoints" / "last.ckpt"
    refused = train(*SHORT, *TENSOR, *fsdp, f"ckpt_path={last}", check=False)
    refused.assert_rejected("on a mesh of 1 data-parallel x 2 tensor-parallel processes, this run's is 2 x 1")
