"""A training killed anywhere, even while it writes a checkpoint, continues exactly when the same command runs
again: from its last complete checkpoint, by itself, with the same per-step losses (bit-identical on CPU)."""

import re
import shutil
import signal

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import OPTIMIZER_NAME
from conftest import PACKAGE, QUICK, Run, make_runner
from engine_specific import reset_engine_state
from forked import start_module
from launchers import accelerate_launch
from own_models import paused
from restarts import RESTARTABLE, STEPS, losses_by_step, run_in
from torch import nn
from wandb_records import offline_runs, sync_dry_run

from {{ cookiecutter.package_name }}.engine.checkpoints import Checkpoints, load_trained
from {{ cookiecutter.package_name }}.engine.loop import Progress
from {{ cookiecutter.package_name }}.errors import ConfigError

pytestmark = pytest.mark.slow

# With dropout: its masks continue exactly only if the checkpoint holds the random state, and the resumed run
# draws nothing from it before training (as a loader would, without a generator of its own).
DROPOUT = [*RESTARTABLE, "+model.net.dropout=0.5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, train_env) -> dict[int, float]:
    run = make_runner(tmp_path_factory.mktemp("uninterrupted"), train_env)(*DROPOUT, "strategy=single")
    losses = losses_by_step(run.run_dir)
    assert list(losses) == list(range(STEPS))
    return losses


def test_killed_while_saving_then_run_again_continues_exactly(tmp_path, train_env, uninterrupted):
    run_dir = tmp_path / "run"
    killed_at_step_6 = [  # SIGKILL after the checkpoint's weights are written and before its optimizer state
        "model.optimizer._target_=nets.AdamWKilledWhileSaving",
        "+model.optimizer.kill_at_step=6",
        f"+model.optimizer.marker={tmp_path / 'killed'}",
    ]
    first = run_in(run_dir, train_env, *DROPOUT, *killed_at_step_6)
    assert first.returncode == -9, first.stdout + first.stderr
    checkpoints = run_dir / "checkpoints"
    partial = checkpoints / ".step-0000006.partial"
    assert [path.name for path in partial.iterdir()] == ["model.safetensors"], "killed half-way through the save"
    assert (checkpoints / "last").resolve() == checkpoints / "step-0000003", "last: the previous, complete one"

    again = run_in(run_dir, train_env, *DROPOUT, *killed_at_step_6)  # the same command, no flag
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from" in again.stdout and "step-0000003" in again.stdout
    assert "note:" not in again.stdout + again.stderr, "the same command: nothing changed (config.yaml: 32-true)"
    assert losses_by_step(run_dir) == uninterrupted  # exactly; steps 3-5 ran twice, logged once
    assert "Would sync 2 run(s)" in sync_dry_run(run_dir, train_env), "the README's upload takes both starts"

    config = (run_dir / "config.yaml").read_text()
    other = ["data.batch_size=32", "model.net.hidden=64"]  # another training, in the same folder (same run id)
    refused = run_in(run_dir, train_env, *DROPOUT, *other)
    refused = Run(refused.returncode, refused.stdout + refused.stderr, run_dir)
    differences = "data.batch_size: 64 then, 32 now; model.net.hidden: 128 then, 64 now"
    refused.assert_rejected(differences, in_existing_run=True)
    assert "give resume=false to start afresh there" in refused.output and "or run_id=NAME" in refused.output
    assert (run_dir / "config.yaml").read_text() == config
    assert not partial.exists(), "the half-written checkpoint is cleared away"
    assert (checkpoints / "last").resolve() == checkpoints / f"step-{STEPS:07d}"
    assert load_trained(checkpoints / "last") is not None

    kept = sorted(path.name for path in checkpoints.iterdir())
    past = run_in(run_dir, train_env, *DROPOUT, *killed_at_step_6, "trainer.max_steps=2")  # not a no-op: refused
    past = Run(past.returncode, past.stdout + past.stderr, run_dir)
    past.assert_rejected(f"has trained 2 epochs ({STEPS} steps), past trainer.max_steps=2", in_existing_run=True)
    bad = run_in(run_dir, train_env, *DROPOUT, "resume=false", "checkpoint.async=true")  # refused, deletes nothing
    Run(bad.returncode, bad.stdout + bad.stderr, run_dir).assert_rejected("checkpoint.async=true", in_existing_run=True)
    assert sorted(path.name for path in checkpoints.iterdir()) == kept and len(offline_runs(run_dir)) == 1
    fresh = run_in(run_dir, train_env, *DROPOUT, "trainer.max_steps=2", "resume=false")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert f"resume=false: starting afresh, removing the earlier training's checkpoints in {run_dir}" in fresh.stdout
    assert (checkpoints / "last").resolve() == checkpoints / "step-0000002"
    assert len(offline_runs(run_dir)) == 2, "and a new wandb run"


def test_shards_are_not_resumed_on_another_mesh(tmp_path, train_env):
    """Tensor parallel over 2 processes -> FSDP over 2: the optimizer's parameter groups follow the mesh, so its
    saved state would load into the wrong groups (KeyError 'betas' at the first step). Refused before training."""
    train = make_runner(tmp_path, train_env)
    short = ["strategy=model_parallel", "trainer.max_steps=2", "checkpoint.every_n_steps=2", "logger=none"]
    tensor = train(*short, "test_after_fit=false", launcher=accelerate_launch())
    last = tensor.run_dir / "checkpoints" / "last"
    fsdp = ["strategy.data_parallel_size=2", "strategy.tensor_parallel_size=1", f"ckpt_path={last}"]
    refused = train(*short, *fsdp, launcher=accelerate_launch(), check=False)
    # Each process refuses in one line (exit 2); accelerate launch then reports its failed children its own way.
    assert refused.returncode != 0
    assert (
        "error: " + str(last / "sharded") + " was saved by strategy=model_parallel on a mesh of 1 data-parallel x 2 "
        "tensor-parallel processes, this run's is 2 x 1" in refused.output
    )
    assert "or start from another checkpoint, or none" in refused.output  # (ckpt_path=: resume=false keeps it)
    assert "KeyError" not in refused.output and not (refused.run_dir / "checkpoints").exists(), "before training"


def test_ctrl_c_stops_the_processes_ddp_spawn_started_in_one_line(tmp_path, train_env):
    """strategy=ddp_spawn starts its processes itself, through torch's elastic agent in this command: Ctrl-C stops
    them at once and says in one line how to continue (exit 130), where the agent raised a traceback."""
    net = ["model.net._target_=own_models.PausedOnce", f"+model.net.marker={tmp_path / 'pause'}"]
    command = [*QUICK, "strategy=ddp_spawn", "trainer.devices=2", *net, f"hydra.run.dir={tmp_path / 'run'}"]
    proc = start_module(f"{PACKAGE}.train", command, train_env, tmp_path, tmp_path / "log", f"{PACKAGE}.train")
    assert paused(tmp_path / "pause", proc), (tmp_path / "log").read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    code, output = proc.wait(120), (tmp_path / "log").read_text()
    assert code == 130 and "Traceback" not in output, output[-3000:]
    assert "strategy=ddp_spawn: starting 2 processes" in output and "CUDAs" not in output  # (accelerate's words)
    saved = any((tmp_path / "run" / "checkpoints").glob("step-*"))  # (stopped before or after its first checkpoint)
    how = (
        "continue with the same command (its hydra.run.dir holds the checkpoints), from its last checkpoint"
        if saved
        else "it saved no checkpoint to continue from; run the command again to start over"
    )
    stopped = "SIGINT: the 2 processes stopped at once (ddp_spawn's processes save no checkpoint on a stop): "
    assert output.strip().splitlines()[-1] == stopped + how


def test_where_the_loop_stood_is_read_from_older_checkpoints_and_keeps_its_best_by_metric():
    """A checkpoint of before checkpoint.monitor (best_val_loss) keeps its best val/loss; Progress.best belongs to
    the metric it was of: resumed with another checkpoint.monitor, validate() starts that metric's best afresh."""
    older = Progress()
    older.load_state_dict({"epoch": 1, "global_step": 8, "best_val_loss": 0.25, "loader": {}})
    assert (older.epoch, older.best, older.monitor) == (1, 0.25, "val/loss") and "best_val_loss" not in vars(older)
    fresh = Progress()
    fresh.load_state_dict({"best_val_loss": float("inf")})
    assert fresh.best is None
    again = Progress()
    again.load_state_dict(older.state_dict())
    assert again.state_dict() == older.state_dict()


def test_a_checkpoint_folder_missing_a_file_accelerate_opens_is_refused_in_one_line(tmp_path):
    """A registered object's state, the optimizer's, every random state: missing (a copy cut short, a file deleted),
    accelerate's load_state raised its RuntimeError or FileNotFoundError, or, without the random states, went on
    with other random numbers than the uninterrupted run's."""
    accelerator = Accelerator(cpu=True)
    try:
        net = nn.Linear(2, 2)
        net, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
        accelerator.register_for_checkpointing(Progress(), Progress())  # (the loop's progress, a schedule's place)
        checkpoints = Checkpoints(accelerator, tmp_path / "checkpoints")
        checkpoints.save(1)
        whole = tmp_path / "checkpoints" / "step-0000001"
        checkpoints.load(whole)
        for name in ("custom_checkpoint_1.pkl", f"{OPTIMIZER_NAME}.bin", "random_states_0.pkl"):
            copy = shutil.copytree(whole, tmp_path / name)
            (copy / name).unlink()
            with pytest.raises(ConfigError, match=f"^{copy}: {re.escape(name)} missing \\(a copy cut short, a file"):
                checkpoints.load(copy)
        # A folder of the user's there (a pretrained checkpoint given as ckpt_path=, a teammate's copy) is not the
        # run's to remove: each save removed every folder but its own newest
        shutil.copytree(whole, tmp_path / "checkpoints" / "pretrained")
        checkpoints.save(2)
        kept = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
        assert kept == ["last", "pretrained", "step-0000002"], kept
    finally:
        reset_engine_state()
