"""Real trainings on CPU: the default run learns, logs one wandb run, checkpoints and resumes."""

import pytest
from conftest import QUICK

pytestmark = pytest.mark.slow


def test_default_training_learns_and_logs_to_wandb(train):
    run = train("trainer.max_epochs=2", "trainer.enable_progress_bar=false", "~callbacks.progress_bar")
    wandb = run.wandb
    assert wandb.metric("val/acc")[-1] > 0.6, "chance is 1/8; the README promises about 0.85"
    assert wandb.metric("test/acc"), "test runs after fit by default"
    assert wandb.metric("val/loss")[-1] < wandb.metric("val/loss")[0]
    losses = wandb.metric("train/loss")
    assert len(losses) == 64 // 10 and losses[-1] < losses[0]
    assert wandb.steps("train/loss") == [9, 19, 29, 39, 49, 59], "train/loss is logged at the global step"
    assert wandb.group == "default"
    assert wandb.config["data"]["batch_size"] == 256
    assert wandb.config["run"]["strategy_preset"] == "{{ cookiecutter.default_strategy }}"
    assert wandb.exit_code == 0
    assert (run.run_dir / "config.yaml").is_file()
    assert (run.run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "wandb sync" in run.output


def test_resume_continues_the_global_step(train):
    first = train(*QUICK, "trainer.max_epochs=3", "trainer.max_steps=8", "logger=none")
    assert not (first.run_dir / "wandb").exists(), "logger=none must not start wandb"
    checkpoint = first.run_dir / "checkpoints" / "last.ckpt"
    resumed = train(*QUICK, "trainer.max_epochs=3", "trainer.max_steps=12", f"ckpt_path={checkpoint}")
    assert resumed.wandb.steps("train/loss") == [8, 9, 10, 11]
