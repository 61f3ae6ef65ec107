"""The OOM toolkit (`oom=toolkit`) on CPU, with out-of-memory errors simulated by tests/nets.py."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from conftest import PARITY, QUICK, TOLERANCE, K
from launchers import accelerate_launch
from nets import OOMNet

from {{ cookiecutter.package_name }}.config import ConfigError
from {{ cookiecutter.package_name }}.oom import OOMRecovery, OutOfMemoryStop
from {{ cookiecutter.package_name }}.strategies import Strategy
from {{ cookiecutter.package_name }}.strategies.pipeline import PipelineParallel

OOM = [*QUICK, "trainer.accelerator=cpu", "oom=toolkit", "model.net._target_=nets.OOMNet", "data.batch_size=128"]
FINDER = [*OOM, "oom.find_batch_size=true"]


# --- the recovery, in this process: its memory of a split, backward OOMs, its failure count -------------------


def train_steps(recovery: dict | None, max_batch: dict[int, int], steps: int = 4, **oom) -> tuple[list, object]:
    """Per-step losses of a few SGD steps on one process, the net running out of memory above max_batch[step]
    (from that step on), trained through OOMRecovery(**recovery), or without it (None)."""
    torch.manual_seed(0)
    accelerator, strategy = Accelerator(cpu=True), Strategy()
    net = OOMNet(32, 8, hidden=16, depth=2, max_batch=64, **oom)
    model, optimizer = strategy.prepare(accelerator, net, partial(torch.optim.SGD, lr=0.5))
    stepper = OOMRecovery(strategy, **recovery) if recovery is not None else None
    losses = []
    for step in range(steps):
        net.max_batch = max_batch.get(step, net.max_batch)
        x, y = torch.randn(64, 32), torch.randint(0, 8, (64,))
        if stepper:
            loss = stepper.train_step(accelerator, model, x, y, F.cross_entropy, step)
        else:
            loss = strategy.train_step(accelerator, model, x, y, F.cross_entropy)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, stepper


@pytest.fixture(scope="module")
def losses_without_oom():
    return train_steps(None, {})[0]


@pytest.mark.parametrize("in_backward", [False, True], ids=["forward", "backward"])
def test_recovery_keeps_the_split_that_worked(losses_without_oom, in_backward):
    """Every batch of 64 is too big, in the forward or in the backward: one OOM, then every step starts from 2
    parts (not one OOM per step), with the losses of a run without OOMs."""
    losses, recovery = train_steps({}, {0: 32}, in_backward=in_backward)
    assert losses == pytest.approx(losses_without_oom, abs=TOLERANCE)
    assert (recovery.events, recovery.parts) == (1, 2)


def test_a_step_that_works_resets_the_failure_count():
    """OOMs at steps 1 and 3, a working split in between: never two in a row, so no stop at max_consecutive=2."""
    _, recovery = train_steps({"max_consecutive": 2}, {1: 32, 3: 16})
    assert (recovery.events, recovery.consecutive, recovery.parts) == (2, 0, 4)
    with pytest.raises(OutOfMemoryStop, match="2 out-of-memory errors in a row at step 1"):
        train_steps({"max_consecutive": 2}, {1: 0})


def test_presets_whose_forward_is_a_collective_refuse_the_recovery():
    with pytest.raises(ConfigError) as refused:
        OOMRecovery(PipelineParallel())
    assert "oom.recovery works under strategy=single|ddp|ddp_spawn, not strategy=pipeline" in str(refused.value)


# --- real trainings ----------------------------------------------------------------------------


@pytest.mark.slow
def test_one_rank_out_of_memory_splits_on_every_rank_with_the_losses_of_one_device(train, single_losses):
    """Rank 1 cannot take its 32 samples: both ranks split them in 2, once, and train on as one device would."""
    run = train(*PARITY, "strategy=ddp", "oom=toolkit", "model.net._target_=nets.OOMNet", "+model.net.max_batch=16",
                "+model.net.oom_rank=1", launcher=accelerate_launch())  # fmt: skip
    assert run.losses(K) == pytest.approx(single_losses, abs=TOLERANCE)
    assert run.wandb.metric("oom/events") == [1] and run.wandb.metric("oom/parts") == [1]
    assert "OOMRecovery: the batch fits in 2 part(s)" in run.output


@pytest.mark.slow
def test_one_rank_out_of_memory_makes_every_rank_shrink(train):
    """Rank 1 cannot take more than 40 samples; rank 0 could. Both must train with 90% of 40 (accelerate's own
    find_executable_batch_size would shrink rank 1 only, and the ranks would then disagree)."""
    one_rank_40 = ["+model.net.max_batch=40", "+model.net.oom_rank=1"]
    run = train(*FINDER, "strategy=ddp", *one_rank_40, launcher=accelerate_launch())
    wandb = run.wandb
    assert wandb.metric("batch_size_finder/largest_fitting") == [40]
    assert wandb.metric("batch_size_finder/per_device_batch_size") == [36]
    assert wandb.metric("batch_size_finder/global_batch_size") == [72]
    assert "global batch 128 -> 72 (x0.562): this changes the optimisation" in run.output
    assert len(wandb.metric("train/loss")) == 8192 // 72, "an epoch of global batches of 72"
    # Per-rank memory each epoch, and how uneven it is.
    assert len(wandb.metric("memory/rank0/rss_mb")) == len(wandb.metric("memory/rank1/rss_mb")) == 1
    assert wandb.metric("memory/imbalance")[0] >= 1.0


@pytest.mark.slow
def test_the_search_grows_a_batch_that_fits_as_lightnings_does(train):
    """Doubles from 128 until 1024 fails, then bisects to within 5% of 1000; trains with 90% of it."""
    wandb = train(*FINDER, "strategy=single", "+model.net.max_batch=1000", "trainer.max_steps=2").wandb
    [largest] = wandb.metric("batch_size_finder/largest_fitting")
    assert 950 <= largest <= 1000
    assert wandb.metric("batch_size_finder/global_batch_size") == [int(largest * 0.9)]


@pytest.mark.slow
def test_presets_whose_forward_is_a_collective_refuse_the_search(train):
    run = train(*FINDER, "strategy=pipeline", check=False)
    run.assert_rejected("oom.find_batch_size works with single, ddp, ddp_spawn and dp, not strategy=pipeline")
