"""float8 on the CPU, as far as torchao runs there (a training refuses the CPU in one line: tests/test_optimization.py):
which layers are converted, that a model too small to gain is refused, that the checkpoint keys stay, and that the
converted model computes what the unconverted one does, up to float8's rounding. Its speed: the GPU check."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torchao.float8", reason="float8 needs torchao: pip install -e '.[float8]'")

from {{ cookiecutter.package_name }}.errors import ConfigError  # noqa: E402
from {{ cookiecutter.package_name }}.models.float8 import check_float8_layers, convert_float8, float8_layers  # noqa: E402
from {{ cookiecutter.package_name }}.models.gpt import GPT  # noqa: E402

ATTENTION, MLP = ("attn.q", "attn.k", "attn.v", "attn.out"), ("mlp.fc_in", "mlp.fc_out")


def gpt(dim: int, depth: int = 2) -> GPT:
    return GPT(vocab_size=4096, max_seq_len=32, dim=dim, depth=depth, num_heads=16)


def test_only_the_blocks_linear_layers_big_enough_to_gain_are_converted():
    """dim 2048: tensorwise converts every Linear of the blocks; rowwise only the MLP's up-projection (8192 x 2048),
    by torchao's thresholds. Never the embedding or the head (tied to it)."""
    with torch.device("meta"):
        net = gpt(2048)
    assert float8_layers(net, "tensorwise") == [f"blocks.{i}.{name}" for i in range(2) for name in (*ATTENTION, *MLP)]
    assert float8_layers(net, "rowwise") == ["blocks.0.mlp.fc_in", "blocks.1.mlp.fc_in"]
    converted = convert_float8(net, "rowwise")
    assert converted == ["blocks.0.mlp.fc_in", "blocks.1.mlp.fc_in"]
    kinds = {name: type(module).__name__ for name, module in net.named_modules()}
    assert kinds["blocks.0.mlp.fc_in"] == "Float8Linear" and kinds["blocks.0.mlp.fc_out"] == "Linear"
    assert kinds["head"] == "Linear" and net.head.weight is net.embed.tokens.weight, "the head stays tied, unconverted"
    assert convert_float8(net, "rowwise") == [], "a second setup converts nothing more"


def test_a_model_too_small_to_gain_is_refused_in_one_line():
    with torch.device("meta"):
        net = gpt(64)  # model=gpt's default size
    with pytest.raises(
        ConfigError, match="float8=tensorwise converts no layer of GPT: the Linear layers of its blocks"
    ):
        check_float8_layers(net, "tensorwise")
    check_float8_layers(net, "none")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_converted_model_keeps_its_checkpoint_keys_and_computes_the_same_loss(recipe):
    torch.manual_seed(0)
    plain = gpt(2048, depth=1)
    converted = gpt(2048, depth=1)
    converted.load_state_dict(plain.state_dict())
    convert_float8(converted, recipe)
    assert converted.state_dict().keys() == plain.state_dict().keys(), "a checkpoint loads with float8 on or off"
    tokens = torch.randint(0, 4096, (2, 32))
    losses = []
    for net in (plain, converted):  # in float32: Float8Linear casts its input the same way (bf16's backward on the
        loss = F.cross_entropy(net(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())  # CPU: 25 s, CI time)
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=0.01), "float8 rounds; it does not change the model"
    fc_in = converted.blocks[0].mlp.fc_in
    assert fc_in.weight.grad is not None and fc_in.weight.dtype == torch.float32, "the weights stay fp32 parameters"
