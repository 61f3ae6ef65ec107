"""strategy=fsdp: FSDP2 over every process trains as one device does, and a training of it killed mid-run
continues exactly from its sharded checkpoint (the same command again, in the same run folder); the options it has
and model_parallel lacks (HSDP, offload, reshard_after_forward) run in tests/layouts.py's fsdp-hsdp row; bad settings
are refused in one line before training."""

import pytest
import torch
from conftest import QUICK, TOLERANCE, make_runner
from engine_specific import LAST, launcher_of

from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.sharding import FsdpSettings, check_fsdp

# Shuffled; 8 steps, a checkpoint every 3.
SETTINGS = [*QUICK, "trainer.accelerator=cpu", "data.shuffle=true", "data.train_size=512", "data.batch_size=64",
            "trainer.max_steps=8", "checkpoint.every_n_steps=3"]  # fmt: skip
STEPS = 8


def test_replicas_that_do_not_divide_the_processes_and_batchnorm_are_refused():
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2)
    check_fsdp(net, 4, FsdpSettings(replicas=2))
    with pytest.raises(ConfigError, match="strategy.replicas=3 must divide the 4 processes: .* valid: 1, 2, 4"):
        check_fsdp(net, 4, FsdpSettings(replicas=3))
    batchnorm = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2, norm="batch")
    with pytest.raises(ConfigError, match="strategy=fsdp does not synchronise BatchNorm statistics"):
        check_fsdp(batchnorm, 2, FsdpSettings())


@pytest.mark.slow
def test_a_stopped_fsdp_training_continues_exactly_from_its_shards(tmp_path, train_env):
    train = make_runner(tmp_path, train_env)
    single = train(*SETTINGS, "strategy=single").losses(STEPS)
    assert len(single) == STEPS

    # Every process killed in the forward of step 7, right after the checkpoint of step 6.
    net = ["model.net._target_=own_models.InterruptedOnce", f"+model.net.marker={tmp_path / 'once'}",
           "+model.net.at=6", "+model.net.signal_name=SIGKILL"]  # fmt: skip
    command = [*SETTINGS, *net, "strategy=fsdp", "trainer.devices=2"]
    run_dir, launcher = tmp_path / "fsdp", launcher_of("fsdp", 2)
    killed = train(*command, launcher=launcher, run_dir=run_dir, check=False)
    assert killed.returncode != 0 and (run_dir / LAST).exists(), killed.output[-3000:]
    again = train(*command, launcher=launcher, run_dir=run_dir)  # the same command again: resumes from its shards
    assert "resuming from" in again.output
    assert killed.losses(STEPS + 1) == pytest.approx(single, abs=TOLERANCE)  # in one wandb run, each step once

    trained = load_trained(run_dir / LAST)  # the shards, put together on one device
    assert trained(torch.randn(4, 32)).shape == (4, 8)  # data=synthetic: 32 features, 8 classes
