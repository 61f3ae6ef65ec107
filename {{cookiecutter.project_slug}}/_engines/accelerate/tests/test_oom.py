"""The OOM toolkit (`oom=toolkit`) on CPU, with out-of-memory errors simulated by tests/nets.py."""

import pytest
from conftest import QUICK
from launchers import accelerate_launch

pytestmark = pytest.mark.slow

OOM = [*QUICK, "trainer.accelerator=cpu", "oom=toolkit", "model.net._target_=nets.OOMNet", "data.batch_size=128"]


def test_one_rank_out_of_memory_makes_every_rank_shrink(train):
    """Rank 1 cannot take 64 samples; rank 0 could. Both must train with 32 (accelerate's own
    find_executable_batch_size would shrink rank 1 only, and the ranks would then disagree)."""
    run = train(*OOM, "strategy=ddp", "+model.net.max_batch=40", "+model.net.oom_rank=1", launcher=accelerate_launch())
    wandb = run.wandb
    assert wandb.metric("batch_size_finder/per_device_batch_size") == [32]
    assert wandb.metric("batch_size_finder/global_batch_size") == [64]
    assert len(wandb.metric("train/loss")) == 8192 // 64, "an epoch of global batches of 64"
    # Per-rank memory each epoch, and how uneven it is.
    assert len(wandb.metric("memory/rank0/rss_mb")) == len(wandb.metric("memory/rank1/rss_mb")) == 1
    assert wandb.metric("memory/imbalance")[0] >= 1.0


def test_a_batch_that_fits_is_kept(train):
    run = train(*OOM, "strategy=single", "+model.net.max_batch=1000")
    assert run.wandb.metric("batch_size_finder/global_batch_size") == [128]


def test_presets_whose_forward_is_a_collective_refuse_the_search(train):
    run = train(*OOM, "strategy=pipeline", check=False)
    assert run.returncode == 2
    assert "oom.find_batch_size works with single, ddp, ddp_spawn and dp, not strategy=pipeline" in run.output
