"""How a model describes its split (model_split.py): any chain of layers, checked before training."""

from functools import partial

import pytest
import torch
from conftest import QUICK, TOLERANCE
from layouts import command, layout
from own_models import (
    Conv1DBlocks,
    CustomInit,
    FusedProj,
    FusedQKV,
    LongSkip,
    Masked,
    NormalizedHidden,
    PositionSummed,
)
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.gpt import GPT
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.pipelining import check_pipeline
from {{ cookiecutter.package_name }}.parallel.plan_values import check_plan_values
from {{ cookiecutter.package_name }}.parallel.sharding import (
    OnMeta,
    check_layer_devices,
    check_layer_split,
    check_tensor_parallel,
    materialize,
)
from {{ cookiecutter.package_name }}.parallel.split import (
    Split,
    check_chain,
    find_split,
    layer_groups,
    pipeline_stage,
    register_split,
)


class Attention(nn.Module):
    """Self-attention whose heads tensor parallelism would split: q, k and v colwise, out rowwise."""

    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (proj(x).unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for proj in (self.q, self.k, self.v))
        return x + self.out(nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2))


class TinyViT(nn.Module):
    """Not the example's shape: a stem, a Sequential of attention layers, a pooling and a classifier."""

    def __init__(self, width: int = 48, num_heads: int = 6) -> None:
        super().__init__()
        self.stem = nn.Linear(16, width)
        self.layers = nn.Sequential(*(Attention(width, num_heads) for _ in range(3)))
        self.pool = nn.Flatten(-2)
        self.classifier = nn.Linear(4 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.layers(self.stem(x))))


register_split(
    TinyViT,
    Split(
        first=["stem"],
        blocks=["layers.*"],
        last=["pool", "classifier"],
        tensor_parallel={f"layers.*.{proj}": ColwiseParallel() for proj in "qkv"} | {"layers.*.out": RowwiseParallel()},
    ),
)


def test_pipeline_stages_of_any_chain_compose_to_the_net_under_its_names():
    torch.manual_seed(0)
    net, x = TinyViT(), torch.randn(2, 4, 16)
    stages = [pipeline_stage(net, stage, 2, split_points=[1]) for stage in range(2)]
    assert torch.equal(stages[1](stages[0](x)), net(x))
    names = [set(stage.state_dict()) for stage in stages]
    assert names[0].isdisjoint(names[1]) and names[0] | names[1] == set(net.state_dict())
    assert {name.split(".")[0] for name in names[0]} == {"stem", "layers"}
    groups = layer_groups(net, 3)
    assert [module for group in groups for module in group] == [net.stem, *net.layers, net.pool, net.classifier]


def test_the_split_is_found_inside_a_wrapper_and_its_absence_named():
    wrapper = nn.Module()
    wrapper.net = TinyViT()
    assert find_split(wrapper, "pipeline")[0] is wrapper.net
    wrapper.net = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="strategy=pipeline needs to know how to split Sequential"):
        find_split(wrapper, "pipeline")


def test_a_plan_that_changes_what_the_net_computes_is_refused_by_its_values():
    """Run over simulated ranks in this process (parallel/plan_values.py): the net's output on one sample must be the
    unsharded net's. A normalisation between the colwise and the rowwise layer divides well, and trained silently."""
    sample = torch.randn(1, 8)
    check_plan_values(lambda: ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2), sample, 2)
    normalized = partial(NormalizedHidden, in_features=8, num_classes=3, hidden=16, depth=2)
    with pytest.raises(ConfigError, match="the tensor-parallel plan of NormalizedHidden changes what it computes"):
        check_plan_values(normalized, sample, 2)
    check_plan_values(normalized, sample, 1)  # one rank: nothing sharded


def test_tensor_parallel_plan_is_checked_against_heads_and_layers():
    check_tensor_parallel(TinyViT(), tensor_parallel_size=2)  # 6 heads, 48 features: both divide by 2
    # 48 features per projection divide by 4, but the 6 heads do not: the module holding them is named.
    with pytest.raises(ConfigError, match="layers.0 has 6 attention heads, which strategy.tensor_parallel_size=4"):
        check_tensor_parallel(TinyViT(), tensor_parallel_size=4)
    # 6 heads allow 1, 2, 3 and 6 ranks; with 4 processes, a size must divide those too.
    with pytest.raises(ConfigError, match=r"valid with the 4 processes: 1, 2 \(the model allows 1, 2, 3, 6\)$"):
        check_tensor_parallel(TinyViT(), tensor_parallel_size=4, processes=4)
    with pytest.raises(ConfigError, match="layers.0.q has 50 output features, which strategy.tensor_parallel_size"):
        check_tensor_parallel(TinyViT(width=50, num_heads=2), tensor_parallel_size=4)


def test_a_split_naming_a_missing_layer_is_refused():
    class Renamed(TinyViT):
        pass

    register_split(Renamed, Split(first=["stem"], blocks=["blocks.*"]))
    with pytest.raises(ConfigError, match="the Split of Renamed names 'blocks.*', which matches no submodule"):
        check_tensor_parallel(Renamed(), tensor_parallel_size=2)

    class Reused(TinyViT):  # a user's block run twice, listed twice: the chain check's advice did not fit
        pass

    register_split(Reused, Split(first=["stem"], blocks=["layers.0", "layers.1", "layers.0"]))
    with pytest.raises(ConfigError, match="the Split of Reused lists layers.0 twice: list each module once"):
        check_tensor_parallel(Reused(), tensor_parallel_size=2)


def test_weights_tied_to_a_tensor_parallel_layer_are_refused_under_tensor_parallelism():
    """torch gives each sharded layer new parameters: two blocks sharing one weight trained two copies, the losses off
    single's from the second step, in silence (fsdp, ddp and pipeline keep the tie)."""
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2)
    net.blocks[1].fc_in.weight = net.blocks[0].fc_in.weight
    check_tensor_parallel(net, tensor_parallel_size=1)
    with pytest.raises(ConfigError, match=r"blocks.0.fc_in.weight is tied to blocks.1.fc_in.weight \(one parameter\)"):
        check_tensor_parallel(net, tensor_parallel_size=2)


def test_tensor_parallelism_over_a_split_that_shards_nothing_is_refused():
    """Each process would hold the whole model and compute what the others compute (a Split for pipeline only)."""
    check_tensor_parallel(PositionSummed(in_features=8, num_classes=3), tensor_parallel_size=1)  # FSDP-like: fine
    with pytest.raises(ConfigError, match="the Split of PositionSummed shards no layer .its tensor_parallel plan is"):
        check_tensor_parallel(PositionSummed(in_features=8, num_classes=3), tensor_parallel_size=2)


def test_presets_that_split_the_model_refuse_batchnorm_they_would_not_train_like_one_device():
    """pipeline normalises each micro-batch alone; model_parallel's tensor mode does not synchronise or shard the
    statistics. The layer-split mode runs the whole batch through each layer, so it keeps BatchNorm."""
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2, norm="batch")
    with pytest.raises(ConfigError, match="strategy=pipeline computes BatchNorm statistics per micro-batch"):
        check_pipeline(2, 2, 64, net, None)
    with pytest.raises(ConfigError, match="strategy=model_parallel does not synchronise BatchNorm statistics"):
        check_tensor_parallel(net, tensor_parallel_size=1)
    check_layer_split(net, ["cpu", "cpu"])
    layer_norm = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2, norm="layer")
    check_pipeline(2, 2, 64, layer_norm, None)
    check_tensor_parallel(layer_norm, tensor_parallel_size=2)


class CountsCalls(ResidualMLP):
    """A chain, with a buffer of the net itself, outside the Split's parts."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.register_buffer("calls", torch.zeros(()))


def test_a_forward_that_is_not_its_splits_chain_is_refused_and_a_chain_passes():
    """A pipeline runs the Split's parts one after another: a forward that adds a position vector after the embedding
    would be another model. The check names the first part whose input differs; the template's models pass."""
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match="forward gives it something else than embed's output for blocks.0"):
        check_chain(PositionSummed(in_features=8, num_classes=3), torch.randn(1, 8))
    with pytest.raises(ConfigError, match=r"gives it 2 inputs for blocks.0: .* \(e.g. carry a mask inside the one"):
        check_chain(Masked(in_features=8, num_classes=3), torch.randn(1, 8))  # (the hint was a position embedding's)
    check_chain(ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2), torch.randn(1, 8))
    gpt = GPT(vocab_size=32, max_seq_len=8, dim=16, depth=2, num_heads=2)
    check_chain(gpt, torch.randint(0, 32, (1, 8)))
    # a buffer (or weight) outside the Split's parts, its forward a chain: no stage held or saved it, and the
    # checkpoint failed to load under any other preset ("Missing key(s) in state_dict: calls")
    with pytest.raises(ConfigError, match="but calls lie outside them: no stage would train or save them"):
        check_chain(CountsCalls(in_features=8, num_classes=3, hidden=16, depth=2), torch.randn(1, 8))
    # a dict of inputs (its Split a chain or not): the stages pass one tensor; it was a traceback from each process
    with pytest.raises(
        ConfigError, match="strategy=pipeline passes one tensor from stage to stage, the data's x to the"
    ):
        check_chain(ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2), {"a": torch.randn(1, 8)})


class MovedSkip(LongSkip):
    """LongSkip whose forward moves the skipped tensor to the head's device itself: fine on any devices."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skipped = x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x + skipped.to(x.device)))


def test_layer_groups_whose_forward_mixes_devices_are_refused_on_the_cpu():
    """strategy.mode=layers: a skip connection from the first layer group to the last is a RuntimeError at the first
    step on GPUs, which [cpu,cpu] hides; the check follows each tensor's group through the forward. A chain, a skip
    the forward moves itself and a tied head (check_layer_split's, by devices) pass; the net is left as it was."""
    torch.manual_seed(0)
    net = LongSkip(in_features=8, num_classes=3, hidden=16, depth=2)
    before = {key: value.clone() for key, value in net.state_dict().items()}
    with pytest.raises(
        ConfigError, match="but `add` in the net's own forward \\(between its parts\\) takes tensors of"
    ):
        check_layer_devices(net, torch.randn(2, 8), 2)
    assert net.training and not net._forward_pre_hooks and not net.head._forward_pre_hooks
    assert all(torch.equal(value, before[key]) for key, value in net.state_dict().items())
    check_layer_devices(MovedSkip(in_features=8, num_classes=3, hidden=16, depth=2), torch.randn(2, 8), 2)
    check_layer_devices(ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=4), torch.randn(2, 8), 4)
    gpt = GPT(vocab_size=32, max_seq_len=8, dim=16, depth=2, num_heads=2)  # its head reuses the embedding's matrix
    check_layer_devices(gpt, torch.randint(0, 32, (2, 8)), 2)
    # A dict input (a batch of one, as data.checks.first_input gives it): it went unchecked, and trained on [cpu,cpu]
    with pytest.raises(ConfigError, match="but `add` in the net's own forward"):
        check_layer_devices(DictInput(in_features=8, num_classes=3, hidden=16, depth=2), {"x": torch.randn(1, 8)}, 2)
    check_layer_devices(DictInputChain(in_features=8, num_classes=3, hidden=16, depth=2), {"x": torch.randn(1, 8)}, 2)


class DictInput(LongSkip):
    """LongSkip reading its input from a dict batch."""

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return super().forward(batch["x"])


class DictInputChain(ResidualMLP):
    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return super().forward(batch["x"])


def test_a_tensor_parallel_plan_over_layers_torch_cannot_shard_is_refused():
    """torch's ColwiseParallel and RowwiseParallel shard nn.Linear and nn.Embedding only: a plan over a model
    library's Conv1D would end in a traceback from every process after start. Refused before, naming the layer."""
    with pytest.raises(ConfigError, match=r"shards blocks.0.up \(Conv1D\) with ColwiseParallel, which torch applies"):
        check_tensor_parallel(Conv1DBlocks(in_features=8, num_classes=3), 2)


def test_a_fused_projection_sharded_by_columns_is_refused():
    """A fused q/k/v Linear sharded column-wise gives rank 0 all of q and half of k instead of its heads' q, k and v:
    a silently different model. Refused by its name (qkv, c_attn, gate_up, ...) or, in attention, its 3 x dim
    outputs; the GPT's separate q, k and v pass."""
    with pytest.raises(ConfigError, match=r"blocks.0.qkv looks like a fused projection \(its name, qkv\)"):
        check_tensor_parallel(FusedQKV(), 2)
    with pytest.raises(ConfigError, match=r"blocks.0.proj looks like a fused projection \(3 x 16 outputs in an"):
        check_tensor_parallel(FusedProj(), 2)
    check_tensor_parallel(GPT(vocab_size=32, max_seq_len=8, dim=16, depth=2, num_heads=2), 2)


def test_a_model_that_draws_its_own_weights_starts_sharded_from_singles_weights():
    """strategy.init=full (the default) copies each shard from a whole build on the CPU: the weights one device
    starts from, whatever the model's __init__ draws; init=meta, module by module, refuses a module without
    reset_parameters() in one line (and could not reproduce the model's own draws)."""
    torch.manual_seed(3)
    whole = CustomInit(in_features=8, num_classes=3)
    torch.manual_seed(3)
    with OnMeta() as init:
        net = CustomInit(in_features=8, num_classes=3)
    materialize(net, torch.device("cpu"), init.rng_state, partial(CustomInit, in_features=8, num_classes=3))
    for name, value in whole.state_dict().items():
        assert torch.equal(net.state_dict()[name], value), name
    with OnMeta() as init:
        net = CustomInit(in_features=8, num_classes=3)
    with pytest.raises(ConfigError, match="strategy.init=meta draws each module's weights with its reset_parameters"):
        materialize(net, torch.device("cpu"), init.rng_state)


@pytest.mark.slow
@pytest.mark.parametrize(
    "net, layout_name",
    [
        ("CustomInit", "model_parallel-tp2"),  # weights its own __init__ draws, sharded from single's
        # zbv cuts each stage's backward in two (the input's gradient, then the weights'): torch (2.13) computes a
        # stage's weight gradients from its input's, which a frozen first stage sent without one, so the stage after
        # it never trained, in silence
        ("FrozenStart", "pipeline-zbv"),
    ],
)
def test_such_a_model_trains_under_the_preset_as_on_one_device(train, net, layout_name):
    parity = [*QUICK, "trainer.max_steps=3", "data.shuffle=false", "trainer.accelerator=cpu", "data.batch_size=64"]
    parity.append(f"model.net._target_=own_models.{net}")
    single = train(*parity, "strategy=single")
    overrides, launcher = command(layout(layout_name))
    spread = train(*parity, *overrides, launcher=launcher)
    assert spread.losses(3) == pytest.approx(single.losses(3), abs=TOLERANCE)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs the case names")
def test_layers_on_gpus_the_machine_lacks_are_refused_before_training():
    """The README's strategy.devices=[cuda:0,cuda:1], run on a machine without them: one line naming what is
    missing (it was Lightning's "Device should be CPU" after the wandb run started, or an AssertionError)."""
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2)
    with pytest.raises(ConfigError, match=r"strategy.devices=\['cuda:0', 'cuda:1'\]: this machine has no .*cuda:1"):
        check_layer_split(net, [torch.device("cuda:0"), torch.device("cuda:1")])
