"""Helpers for the restart tests: the same command run again in the same run folder, and the per-step losses
of a training that took several starts, read back from its wandb run."""

import sys
from pathlib import Path

from conftest import PACKAGE, QUICK, as_single
from forked import run_module
from wandb_records import offline_runs

# Shuffled (so a resume that repeats or skips a sample shows), 8 steps an epoch, 16 in all, crossing an epoch
# boundary; a checkpoint every 3 steps and at the end of each epoch.
RESTARTABLE = [
    *QUICK,
    "trainer.accelerator=cpu",
    "data.shuffle=true",
    "data.train_size=512",
    "data.batch_size=64",
    "trainer.max_epochs=2",
    "checkpoint.every_n_steps=3",
]
STEPS = 16


def run_in(run_dir: Path, env: dict[str, str], *overrides: str, launcher: list[str] | None = None, timeout=300):
    """One attempt of a training whose run folder is `run_dir`; the finished process. Past `timeout` seconds it is
    killed with every process it started (a launcher's workers too) and subprocess.TimeoutExpired is raised."""
    overrides = tuple(as_single(list(overrides)))  # (the bake's default preset may be another)
    command = [*(launcher or [sys.executable, "-m"]), f"{PACKAGE}.train", f"hydra.run.dir={run_dir}", *overrides]
    assert command[:2] == [sys.executable, "-m"], command
    return run_module(command[2], command[3:], env, run_dir.parent, timeout, preload=f"{PACKAGE}.train")


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """train/loss by global step, read back from the training's one wandb run (all of its starts merged)."""
    (run,) = offline_runs(run_dir)
    steps = run.steps("train/loss")
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    return dict(zip(steps, run.metric("train/loss"), strict=True))
