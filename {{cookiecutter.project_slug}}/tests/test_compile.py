"""compile=true: torch.compile of the net, in place (compilation.py): whole under single and ddp (inside ddp's
wrapper), block by block where a preset splits the net. The first losses must equal the eager net's within
COMPILE_TOLERANCE: compiled kernels fuse operations and may sum in another order.

On a CPU torch.compile writes and compiles C++ (gcc), and that is the cost of these tests (tens of seconds of CPU
per run with an empty compiler cache): the net is one block without norms (few kernels), and inductor's cache,
shared by the processes and both engines' suites, spares much of it. Compiled sharded blocks (model_parallel,
pipeline) are the GPU check's rows (tests/test_presets.py); which modules are compiled is checked below.
"""

import re

import pytest
from conftest import PARITY, K, make_runner
from engine_specific import DDP, DDP_LAUNCH
from torch import nn

from {{ cookiecutter.package_name }}.models.compilation import compile_net
from {{ cookiecutter.package_name }}.models.mlp import Block, ResidualMLP

TINY = ["model.net.depth=1", "model.net.norm=none"]
COMPILE_TOLERANCE = 1e-5  # measured on CPU: within 1e-6 of the eager losses
LAYOUTS = [
    ("single", ["strategy=single"], None),
    ("ddp", DDP, DDP_LAUNCH),
]


@pytest.fixture(scope="module")
def eager_losses(tmp_path_factory, train_env) -> list[float]:
    run = make_runner(tmp_path_factory.mktemp("eager"), train_env)(*PARITY, *TINY, "strategy=single")
    return run.losses(K)


@pytest.mark.slow
@pytest.mark.parametrize("name, overrides, launcher", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_a_compiled_net_trains_like_the_eager_one(train, eager_losses, name, overrides, launcher):
    launch = launcher() if launcher else None
    run = train(*PARITY, *TINY, "compile=true", *overrides, launcher=launch, env={"TORCH_LOGS": "dynamo"})
    # torch.compile logs each function it compiles: here the net's forward only.
    traced = set(re.findall(r"torchdynamo start tracing forward \S+:(\d+)", run.output))
    assert traced == {str(ResidualMLP.forward.__code__.co_firstlineno)}, f"{name}: the whole net is compiled"
    assert run.losses(K) == pytest.approx(eager_losses, abs=COMPILE_TOLERANCE), name


def test_presets_that_split_the_net_compile_each_block():
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2)
    compile_net(net, per_block=True)
    # nn.Module.compile keeps the compiled call in _compiled_call_impl, and the module's class and names.
    compiled = [name for name, module in net.named_modules() if module._compiled_call_impl is not None]
    assert compiled == ["blocks.0", "blocks.1"]
    first = net.blocks[0]._compiled_call_impl
    compile_net(net, per_block=True)  # again (Lightning's configure_model runs for fit and for test): a no-op
    assert net.blocks[0]._compiled_call_impl is first
    assert type(net.blocks[0]) is Block and "blocks.0.fc_in.weight" in net.state_dict()
    whole = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2)
    compile_net(whole, per_block=False)
    assert [name for name, module in whole.named_modules() if module._compiled_call_impl is not None] == [""]
    # A net without a Split (fsdp shards it as one unit): compiled whole. (fsdp compile=true refused it, naming
    # "strategy=model_parallel or pipeline", after the processes had started.)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    compile_net(plain, per_block=True)
    assert [name for name, module in plain.named_modules() if module._compiled_call_impl is not None] == [""]
    # A net of yours wrapping one with a Split: its blocks, as every preset finds them
    wrapper = nn.Sequential(ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2))
    compile_net(wrapper, per_block=True)
    compiled = [name for name, module in wrapper.named_modules() if module._compiled_call_impl is not None]
    assert compiled == ["0.blocks.0", "0.blocks.1"]
