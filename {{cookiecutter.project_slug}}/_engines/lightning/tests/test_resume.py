"""Trainings that die and start again: the same command (or a launcher's restart) continues from the last complete
checkpoint, and every step's loss is the uninterrupted training's. Real kills (SIGKILL), real restarts."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, TOLERANCE, Run, make_runner
from wandb_records import offline_runs

pytestmark = pytest.mark.slow

# 2 epochs of 10 steps, shuffled; a checkpoint every 3 steps and at each epoch's end.
STEPS = 20
TRAIN = [
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "test_after_fit=false",
    "data.train_size=320",
    "data.val_size=64",
    "data.batch_size=32",
    "data.shuffle=true",
    "checkpoint.every_n_steps=3",
]


def kill_at(step: int, marker: Path, rank: int = 0) -> list[str]:
    """SIGKILL process `rank` after optimizer step `step`, the first time only."""
    return [
        "+callbacks.kill._target_=kill_switch.KillAtStep",
        f"+callbacks.kill.step={step}",
        f"+callbacks.kill.rank={rank}",
        f"+callbacks.kill.marker='{marker}'",
    ]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, train_env):
    """The training nothing happens to: one process."""
    run = make_runner(tmp_path_factory.mktemp("uninterrupted"), train_env)(*TRAIN, "strategy=single")
    assert run.wandb.steps("train/loss") == list(range(STEPS))
    return run.wandb


def assert_continues_exactly(run, uninterrupted, starts: int, tolerance: float = 0.0) -> None:
    """One wandb run, every step logged once, with the uninterrupted training's loss."""
    history = run.wandb
    assert history.starts == starts
    assert history.steps("train/loss") == list(range(STEPS)), "each step once, none missing"
    assert history.metric("train/loss") == pytest.approx(uninterrupted.metric("train/loss"), abs=tolerance, rel=0)
    assert history.metric("val/loss") == pytest.approx(uninterrupted.metric("val/loss"), abs=tolerance, rel=0)


def test_a_killed_training_started_again_continues_exactly(train, uninterrupted, tmp_path):
    killed = train(*TRAIN, "strategy=single", *kill_at(7, tmp_path / "killed"), check=False)
    assert killed.returncode == -9, killed.output[-2000:]
    assert (killed.run_dir / "checkpoints/last.ckpt").resolve().name == "step000006.ckpt"
    again = train(*TRAIN, "strategy=single", *kill_at(7, tmp_path / "killed"), run_dir=killed.run_dir)
    assert "resuming from" in again.output
    assert_continues_exactly(again, uninterrupted, starts=2)  # bit-identical: same process layout


def test_a_kill_in_the_middle_of_a_save_leaves_the_previous_checkpoint(train, uninterrupted, tmp_path):
    plugin = "_target_: kill_switch.DyingCheckpointIO, step: 9, marker: '%s'" % (tmp_path / "died")
    dying = "+trainer.plugins=[{" + plugin + "}]"
    killed = train(*TRAIN, "strategy=single", dying, check=False)
    assert killed.returncode == -9, killed.output[-2000:]
    checkpoints = killed.run_dir / "checkpoints"
    assert (checkpoints / "step000009.ckpt").is_file(), "the half-written checkpoint"
    assert (checkpoints / "last.ckpt").resolve().name == "step000006.ckpt", "last still on the complete one"
    again = train(*TRAIN, "strategy=single", dying, run_dir=killed.run_dir)
    assert_continues_exactly(again, uninterrupted, starts=2)


def test_resume_on_another_number_of_processes_keeps_the_global_batch(train, uninterrupted, tmp_path):
    """Decided: allowed. The global batch, hence each step's samples, does not depend on the process count."""
    killed = train(*TRAIN, "strategy=single", *kill_at(7, tmp_path / "killed"), check=False)
    assert killed.returncode == -9, killed.output[-2000:]
    again = train(*TRAIN, "strategy=ddp", "trainer.devices=2", run_dir=killed.run_dir)
    assert_continues_exactly(again, uninterrupted, starts=2, tolerance=TOLERANCE)


def test_a_finished_training_run_again_resumes_unless_resume_is_false(train, uninterrupted):
    done = train(*TRAIN, "strategy=single", "trainer.max_epochs=1")
    again = train(*TRAIN, "strategy=single", "trainer.max_epochs=1", run_dir=done.run_dir)
    assert "resuming from" in again.output and again.wandb.starts == 2
    assert again.wandb.steps("train/loss") == list(range(STEPS // 2)), "nothing left to train, nothing logged"
    afresh = train(*TRAIN, "strategy=single", "trainer.max_epochs=1", "resume=false", run_dir=done.run_dir)
    assert "resume=false: starting afresh, overwriting" in afresh.output
    runs = offline_runs(afresh.run_dir)
    assert len(runs) == 2, "a new wandb run for the new training"
    assert runs[-1].metric("train/loss") == uninterrupted.metric("train/loss")[: STEPS // 2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, "-m"]


def test_torchrun_restarts_a_killed_worker_and_the_training_continues_exactly(train, uninterrupted, tmp_path):
    launcher = torchrun("--standalone", "--nproc-per-node=2", "--max-restarts=2")
    run = train(*TRAIN, "strategy=ddp", *kill_at(7, tmp_path / "killed", rank=1), launcher=launcher)
    assert (tmp_path / "killed").exists(), "rank 1 was killed"
    assert "resuming from" in run.output
    assert_continues_exactly(run, uninterrupted, starts=2, tolerance=TOLERANCE)


def test_two_torchrun_nodes_train_like_one_process_in_one_run_folder(tmp_path, train_env, uninterrupted):
    """Two torchrun agents on this machine rendezvous as two nodes of one process each (c10d)."""
    port, run_id = free_port(), "two-nodes"
    node = torchrun("--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}")
    command = [*node[:-1], f"--rdzv-id={run_id}", "-m", f"{PACKAGE}.train", *TRAIN, "strategy=ddp"]
    agents = [
        subprocess.Popen(command, cwd=tmp_path, env=train_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=1)
        for _ in range(2)
    ]
    outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), "\n".join(output[-3000:] for output in outputs)
    folders = list((tmp_path / "outputs/default").iterdir())
    assert [folder.name for folder in folders] == [run_id], "one run folder, named after the rendezvous id"
    run = Run(0, "".join(outputs), folders[0])
    assert run.wandb.config["run"]["num_nodes"] == 2 and run.wandb.config["run"]["world_size"] == 2
    assert_continues_exactly(run, uninterrupted, starts=1, tolerance=TOLERANCE)
    assert os.path.islink(folders[0] / "checkpoints/last.ckpt")
