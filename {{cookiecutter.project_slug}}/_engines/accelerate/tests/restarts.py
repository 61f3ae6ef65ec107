"""Helpers for the restart tests: the same command run again in the same run folder, and the per-step losses
of a training that took several attempts, read back from all of its wandb files."""

import subprocess
import sys
from pathlib import Path

from conftest import PACKAGE, QUICK
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


def run_in(run_dir: Path, env: dict[str, str], *overrides: str, launcher: list[str] | None = None):
    """One attempt of a training whose run folder is `run_dir`; the finished process."""
    command = [*(launcher or [sys.executable, "-m"]), f"{PACKAGE}.train", f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=run_dir.parent)


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """train/loss by global step over every attempt of the run. A step that two attempts trained (after the
    last checkpoint before a kill) must have had the same loss both times."""
    losses: dict[int, float] = {}
    for run in offline_runs(run_dir):
        for step, loss in zip(run.steps("train/loss"), run.metric("train/loss"), strict=True):
            assert losses.setdefault(step, loss) == loss, f"step {step} trained twice with different losses"
    return dict(sorted(losses.items()))
