"""A training whose whole job is killed at once (every process, wandb's too) and resumed keeps every step in its
wandb run: the steps wandb had not written when it was killed are logged again from the run's metrics file."""

import json

import pytest
from conftest import QUICK, make_runner
from wandb_records import offline_runs

pytestmark = pytest.mark.slow

# Shuffled, 8 steps an epoch, 16 in all; a checkpoint every 3 steps.
SETTINGS = [
    *("trainer.accelerator=cpu", "data.shuffle=true", "data.train_size=512", "data.batch_size=64"),
    *(*QUICK, "trainer.max_epochs=2", "checkpoint.every_n_steps=3"),
]
STEPS = 16


def losses(run_dir) -> dict[int, float]:
    (run,) = offline_runs(run_dir)
    steps = run.steps("train/loss")
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    return dict(zip(steps, run.metric("train/loss"), strict=True))


def test_a_hard_kill_of_the_whole_job_loses_no_step(tmp_path, train_env):
    train = make_runner(tmp_path, train_env)
    whole = losses(train(*SETTINGS).run_dir)
    assert list(whole) == list(range(STEPS))

    run_dir = tmp_path / "killed"
    net = ["model.net._target_=hard_kill.HardKilledOnce", f"+model.net.marker={tmp_path / 'killed-once'}"]
    killed = train(*SETTINGS, *net, run_dir=run_dir, check=False)
    assert killed.returncode == -9, killed.output[-3000:]
    lost = set(range(6)) - set(losses(run_dir))
    assert lost, "the frozen wandb process wrote every step: the kill lost nothing to recover"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {row["trainer/global_step"] for row in rows if "train/loss" in row} >= set(range(6))

    train(*SETTINGS, *net, run_dir=run_dir)  # the same command again: resumes from the checkpoint of 6 steps
    assert losses(run_dir) == whole, f"steps {sorted(lost)} are logged again, each once, with the same values"
