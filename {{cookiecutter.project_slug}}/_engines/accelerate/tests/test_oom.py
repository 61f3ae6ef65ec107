"""The OOM toolkit (`oom=toolkit`) on CPU, with out-of-memory errors simulated by tests/nets.py."""

import pytest
from conftest import QUICK
from launchers import accelerate_launch

pytestmark = pytest.mark.slow

OOM = [*QUICK, "trainer.accelerator=cpu", "oom=toolkit", "model.net._target_=nets.OOMNet", "data.batch_size=128"]


def test_one_rank_out_of_memory_makes_every_rank_shrink(train):
    """Rank 1 cannot take more than 40 samples; rank 0 could. Both must train with 90% of 40 (accelerate's own
    find_executable_batch_size would shrink rank 1 only, and the ranks would then disagree)."""
    run = train(*OOM, "strategy=ddp", "+model.net.max_batch=40", "+model.net.oom_rank=1", launcher=accelerate_launch())
    wandb = run.wandb
    assert wandb.metric("batch_size_finder/largest_fitting") == [40]
    assert wandb.metric("batch_size_finder/per_device_batch_size") == [36]
    assert wandb.metric("batch_size_finder/global_batch_size") == [72]
    assert len(wandb.metric("train/loss")) == 8192 // 72, "an epoch of global batches of 72"
    # Per-rank memory each epoch, and how uneven it is.
    assert len(wandb.metric("memory/rank0/rss_mb")) == len(wandb.metric("memory/rank1/rss_mb")) == 1
    assert wandb.metric("memory/imbalance")[0] >= 1.0


def test_the_search_grows_a_batch_that_fits_as_lightnings_does(train):
    """Doubles from 128 until 1024 fails, then bisects to within 5% of 1000; trains with 90% of it."""
    wandb = train(*OOM, "strategy=single", "+model.net.max_batch=1000", "trainer.max_steps=2").wandb
    [largest] = wandb.metric("batch_size_finder/largest_fitting")
    assert 950 <= largest <= 1000
    assert wandb.metric("batch_size_finder/global_batch_size") == [int(largest * 0.9)]


def test_presets_whose_forward_is_a_collective_refuse_the_search(train):
    run = train(*OOM, "strategy=pipeline", check=False)
    assert run.returncode == 2
    assert "oom.find_batch_size works with single, ddp, ddp_spawn and dp, not strategy=pipeline" in run.output
