"""activation_checkpointing=full|selective: each block of the Split keeps less for the backward and recomputes the
rest, with the same losses and gradients (dropout's masks replayed), under the presets that run blocks their own
way (pipeline's stages, model_parallel's shards) too."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import PARITY, TOLERANCE, K, make_runner
from layouts import command, layout

from {{ cookiecutter.package_name }}.models.activation_checkpointing import checkpoint_blocks
from {{ cookiecutter.package_name }}.models.gpt import GPT
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP


def step(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list, int]:
    """(loss, gradients, numbers of the tensors the forward saved for the backward)."""
    saved = []
    torch.manual_seed(1)  # the same dropout masks for every run
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        logits = net(x)
        loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
    loss.backward()
    return loss.detach(), [param.grad for param in net.parameters()], sum(saved)


NETS = {
    "mlp-dropout": lambda: (
        ResidualMLP(16, 4, hidden=32, depth=3, dropout=0.5),
        torch.randn(8, 16),
        torch.randint(4, (8,)),
    ),
    "mlp-batchnorm": lambda: (
        ResidualMLP(16, 4, hidden=32, depth=3, norm="batch"),
        torch.randn(8, 16),
        torch.randint(4, (8,)),
    ),
    "gpt": lambda: (GPT(64, 16, dim=32, depth=2, num_heads=2), torch.randint(64, (4, 16)), torch.randint(64, (4, 16))),
}


@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize("name", list(NETS))
def test_same_loss_and_gradients_with_fewer_activations_kept(mode, name):
    torch.manual_seed(0)
    net, x, y = NETS[name]()
    reference = copy.deepcopy(net)
    checkpoint_blocks(net, mode)
    loss, grads, saved = step(net, x, y)
    expected_loss, expected_grads, expected_saved = step(reference, x, y)
    assert torch.equal(loss, expected_loss)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(grads, expected_grads, strict=True))
    assert saved < expected_saved, f"{mode} keeps {saved} numbers for the backward, none keeps {expected_saved}"
    assert net.state_dict().keys() == reference.state_dict().keys(), "checkpoints stay the same"
    # BatchNorm's running statistics too: the recomputed forward must not update them a second time
    assert all(torch.equal(a, b) for a, b in zip(net.buffers(), reference.buffers(), strict=True))


def test_a_compiled_batchnorm_block_is_one_graph_and_updates_its_statistics_once():
    """compile=true: the eager restore of BatchNorm's statistics is left out (torch compiles a checkpoint's contexts
    only as dispatch modes: it broke the graph, and the net ran uncompiled without a word); the compiled
    recomputation does not replay the update."""
    torch.manual_seed(0)
    net, x, y = NETS["mlp-batchnorm"]()
    reference = copy.deepcopy(net)
    checkpoint_blocks(net, "full")
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break raises
    F.cross_entropy(compiled(x), y).backward()
    F.cross_entropy(reference(x), y).backward()
    assert all(torch.allclose(a, b) for a, b in zip(net.buffers(), reference.buffers(), strict=True))


@pytest.mark.slow
def test_trainings_with_it_have_the_losses_of_one_device_without(tmp_path, train_env):
    runner = make_runner(tmp_path, train_env)
    single = runner(*PARITY, "strategy=single").losses(K)
    assert runner(*PARITY, "strategy=single", "activation_checkpointing=selective").losses(K) == single
    for name, mode in [("pipeline-gpipe", "full"), ("model_parallel-tp2", "selective")]:
        overrides, launcher = command(layout(name))
        # and the test pass after it (Lightning refused the pipeline's stages there, as a net without a Split)
        run = runner(*PARITY, *overrides, f"activation_checkpointing={mode}", "test_after_fit=true", launcher=launcher)
        assert run.losses(K) == pytest.approx(single, abs=TOLERANCE), name
        assert len(run.wandb.metric("test/loss")) == 1, run.output[-2000:]
        assert run.wandb.metric("epoch")[-1] == 1, "the test row's epoch: the one stopped in, as Lightning counts"
