"""Trainings that die and start again: the same command (or a launcher's restart: torchrun, SLURM requeue) continues
from the last complete checkpoint, and every step's loss is the uninterrupted training's. Real kills (SIGKILL), real
restarts, real torchrun agents and a real SLURM (skipped with the reason where none can be used)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import PACKAGE, TOLERANCE, Run, kill_with_descendants, make_runner
from forked import start_module
from kill_switch import WANDB_FLUSH_SECONDS
from slurm_jobs import ENDED, job_state, wait_for
from wandb_records import offline_runs, sync_dry_run

from {{ cookiecutter.package_name }}.engine.checkpoints import ModelCheckpoint, prepare_run_folder
from {{ cookiecutter.package_name }}.parallel.launcher import free_port

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


def assert_continues_exactly(run, uninterrupted, starts: int, tolerance: float = 0.0, more: bool = False) -> None:
    """One wandb run started `starts` times (or `more`), every step logged once, with the uninterrupted loss."""
    history = run.wandb
    assert history.starts >= starts if more else history.starts == starts
    assert history.steps("train/loss") == list(range(STEPS)), "each step once, none missing"
    assert history.metric("train/loss") == pytest.approx(uninterrupted.metric("train/loss"), abs=tolerance, rel=0)
    assert history.metric("val/loss") == pytest.approx(uninterrupted.metric("val/loss"), abs=tolerance, rel=0)


def test_a_killed_training_started_again_continues_exactly(train, uninterrupted, tmp_path, train_env):
    # Killed once the checkpoint of step 9 was written, before Lightning logged the step (it logs a step after its
    # callbacks' on_train_batch_end): `last` is still the one of step 6, so the restart trains from there, steps
    # 6 and 7 logged already. (`last` on step 9 lost the 9th step's loss for good.)
    kill = ["+callbacks.kill._target_=kill_switch.KillAfterTheSave", "+callbacks.kill.step=9"]
    kill.append(f"+callbacks.kill.marker='{tmp_path / 'killed'}'")
    killed = train(*TRAIN, "strategy=single", *kill, check=False)
    assert killed.returncode == -9, killed.output[-2000:]
    assert (killed.run_dir / "checkpoints/step000009.ckpt").is_file()
    assert (killed.run_dir / "checkpoints/last.ckpt").resolve().name == "step000006.ckpt"
    assert killed.wandb.steps("train/loss")[-1] == 7
    again = train(*TRAIN, "strategy=single", *kill, run_dir=killed.run_dir)
    assert "resuming from" in again.output
    assert "note:" not in again.output, "the same command: nothing changed to say (config.yaml's precision: 32-true)"
    assert_continues_exactly(again, uninterrupted, starts=2)  # bit-identical: same process layout
    assert "Would sync 2 run(s)" in sync_dry_run(again.run_dir, train_env), "the README's upload takes both starts"


def test_a_training_of_max_steps_continues_exactly_from_an_epochs_end(train, uninterrupted):
    """trainer.max_steps set, continued from the checkpoint of the first epoch's end (step 10): Lightning went through
    that epoch's end again and counted it twice, so the next epoch read the data in the order of the one after it
    and the training stopped an epoch early (from the second epoch's end: nothing trained, yet `finished`)."""
    by_steps = [*TRAIN, "strategy=single", f"trainer.max_steps={STEPS}", "checkpoint.keep_last=10"]
    whole = train(*by_steps)
    assert whole.wandb.metric("train/loss") == uninterrupted.metric("train/loss"), "the same training, by steps"
    again = train(*by_steps, f"ckpt_path={whole.run_dir / 'checkpoints' / 'step000010.ckpt'}")
    assert again.wandb.steps("train/loss") == list(range(10, STEPS)), "the second epoch, each step once"
    assert again.wandb.metric("train/loss") == uninterrupted.metric("train/loss")[10:]
    assert again.wandb.metric("val/loss") == uninterrupted.metric("val/loss")[1:]


def test_a_checkpoint_of_an_epochs_last_step_counts_that_epoch(train):
    """checkpoint.every_n_steps on an epoch's last step saves before that epoch's end (its validation), which Lightning
    counts processed only after: continued with fewer epochs than it trained, a checkpoint of 2 epochs was taken for 1
    ("trained to trainer.max_epochs=1 already", a test pass, exit 0), where the Accelerate engine refuses; and its
    count of batches went on into the next epoch."""
    every_epoch = [*(o for o in TRAIN if not o.startswith("checkpoint.")), "checkpoint.every_n_steps=10"]
    whole = train(*every_epoch, "strategy=single", "checkpoint.keep_last=2")
    fewer = train(*every_epoch, "strategy=single", "trainer.max_epochs=1", f"ckpt_path={whole.run_dir}", check=False)
    assert fewer.returncode == 2, fewer.output[-2000:]
    assert "has trained 2 epochs (20 steps), past trainer.max_epochs=1" in fewer.output
    # Fine-tuned from the first epoch's in batches of half the size: the second epoch is 20 steps (it was 10: Lightning
    # carried the first epoch's count of 10 batches of 32 into it)
    first_epoch = f"ckpt_path={whole.run_dir / 'checkpoints' / 'step000010.ckpt'}"
    halves = train(*every_epoch, "strategy=single", "data.batch_size=16", first_epoch)
    assert halves.wandb.steps("train/loss") == list(range(10, 30))


def test_a_run_resumed_from_an_epochs_last_step_saves_checkpoints_that_resume_exactly(train, uninterrupted, tmp_path):
    """Killed after the checkpoint of an epoch's last step (step 10, before that epoch's validation), continued, killed
    again after the checkpoint of step 15, continued: every step's loss is the uninterrupted run's, and run once more,
    it has nothing left to train. (Lightning 2.6 counts that epoch done when it restores the checkpoint, and kept
    taking the run for one restarted inside it: the next epochs' starts went uncounted, so the checkpoints of the
    continued run were an epoch behind, and the run continued from them trained other batches, and an epoch more.)"""
    every_5 = [*(o for o in TRAIN if not o.startswith("checkpoint.")), "checkpoint.every_n_steps=5", "strategy=single"]
    kills = [
        *kill_at(11, tmp_path / "first"),
        *(o.replace("callbacks.kill", "callbacks.kill_again") for o in kill_at(16, tmp_path / "again")),
    ]
    killed = train(*every_5, *kills, check=False)
    assert killed.returncode == -9, killed.output[-2000:]
    assert (killed.run_dir / "checkpoints/last.ckpt").resolve().name == "step000010.ckpt"
    killed_again = train(*every_5, *kills, run_dir=killed.run_dir, check=False)
    assert killed_again.returncode == -9, killed_again.output[-2000:]
    assert (killed.run_dir / "checkpoints/last.ckpt").resolve().name == "step000015.ckpt"
    again = train(*every_5, *kills, run_dir=killed.run_dir)
    assert_continues_exactly(again, uninterrupted, starts=3)
    once_more = train(*every_5, "test_after_fit=true", run_dir=killed.run_dir)
    assert "nothing left to train" in once_more.output, once_more.output[-2000:]
    assert once_more.wandb.steps("train/loss") == list(range(STEPS))
    # at the last step, as after a training that was never stopped (it was logged a step before: 19)
    assert once_more.wandb.steps("test/loss") == [STEPS]


def test_a_dataset_that_augments_in_loader_workers_continues_exactly(train, tmp_path):
    """data=custom whose __getitem__ draws noise, read by 2 loader worker processes, killed after the checkpoint of
    step 6 and started again: every step's loss is the uninterrupted run's. (The workers' random streams, which no
    checkpoint holds, started over on resume: the steps after it trained on other noise.)"""
    synthetic_only = ("data.train_size", "data.val_size")
    noisy = [override for override in TRAIN if not override.startswith(synthetic_only)]
    noisy += ["data=custom", "data.dataset._target_=custom_dataset.NoisyParity", "+data.dataset.size=320"]
    noisy += ["data.num_features=6", "data.num_classes=2", "data.splits=[train,val]", "data.num_workers=2"]
    whole = train(*noisy, "strategy=single")
    killed = train(*noisy, "strategy=single", *kill_at(8, tmp_path / "killed"), check=False)
    assert killed.returncode == -9, killed.output[-2000:]
    again = train(*noisy, "strategy=single", *kill_at(8, tmp_path / "killed"), run_dir=killed.run_dir)
    assert_continues_exactly(again, whole.wandb, starts=2)


def test_a_ctrl_c_at_an_epochs_last_step_stops_after_its_validation(train, uninterrupted, tmp_path):
    """Ctrl-C in the forward of the first epoch's last step (10): saved before that epoch's validation, then continued,
    Lightning (2.6) took the epoch for done and never validated it (in the Accelerate engine it did): that epoch's
    val/loss was missing, and so was it among the candidates for the best checkpoint."""
    net = ["model.net._target_=own_models.InterruptedOnce", f"+model.net.marker={tmp_path / 'once'}", "+model.net.at=9"]
    stopped = train(*TRAIN, "strategy=single", *net, check=False)
    assert stopped.returncode == 130, stopped.output[-2000:]
    assert "interrupted after step 10, saved in" in stopped.output
    assert stopped.wandb.steps("val/loss") == [9], "the epoch's validation, before the stop"
    again = train(*TRAIN, "strategy=single", *net, run_dir=stopped.run_dir)
    assert_continues_exactly(again, uninterrupted, starts=2)  # (val/loss at both epochs' ends, each once)


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
    # First stopped by trainer.max_steps=4 in its epoch, then finished by the same command without it: it goes on
    # with the epoch's 5th batch. (Its checkpoint was written at the epoch's end, which Lightning had counted done:
    # the run continued from it trained nothing more. Losses: the first steps alone, the schedule keeps its span.)
    stopped = train(*TRAIN, "strategy=single", "trainer.max_epochs=1", "trainer.max_steps=4")
    assert (stopped.run_dir / "checkpoints/last.ckpt").resolve().name == "step000004.ckpt"
    done = train(*TRAIN, "strategy=single", "trainer.max_epochs=1", run_dir=stopped.run_dir)
    assert "note: trainer.max_steps: 4 then, -1 now: the run's cosine schedule keeps the span it" in done.output
    assert done.wandb.steps("train/loss") == list(range(STEPS // 2)), "each step once, none missing"
    assert done.wandb.steps("val/loss") == [3, *uninterrupted.steps("val/loss")[:1]], (
        "where it stopped, its epoch's end"
    )
    assert done.wandb.metric("train/loss")[:4] == uninterrupted.metric("train/loss")[:4]
    again = train(*TRAIN, "strategy=single", "trainer.max_epochs=1", run_dir=done.run_dir)
    assert "resuming from" in again.output and again.wandb.starts == 3
    assert (
        "note: this run has trained to trainer.max_epochs=1 already (10 steps): nothing left to train" in again.output
    )
    assert again.wandb.steps("train/loss") == list(range(STEPS // 2)), "nothing left to train, nothing logged"
    config = (done.run_dir / "config.yaml").read_text()
    other = ["data.batch_size=64", "model.net.hidden=64"]  # another training, in the same folder (same run id)
    refused = train(*TRAIN, "strategy=single", "trainer.max_epochs=1", *other, run_dir=done.run_dir, check=False)
    differences = "data.batch_size: 32 then, 64 now; model.net.hidden: 128 then, 64 now"
    refused.assert_rejected(differences, in_existing_run=True)
    assert "give resume=false to start afresh there" in refused.output and "or run_id=NAME" in refused.output
    assert (done.run_dir / "config.yaml").read_text() == config
    past = train(
        *TRAIN, "strategy=single", "trainer.max_epochs=1", "trainer.max_steps=3", run_dir=done.run_dir, check=False
    )
    past.assert_rejected(f"has trained 1 epoch ({STEPS // 2} steps), past trainer.max_steps=3", in_existing_run=True)
    # A refused resume=false deletes nothing (async saving is refused under single after the config is built).
    checkpoints = sorted(path.name for path in (done.run_dir / "checkpoints").iterdir())
    bad = train(*TRAIN, "strategy=single", "resume=false", "checkpoint.async=true", run_dir=done.run_dir, check=False)
    bad.assert_rejected("checkpoint.async=true", in_existing_run=True)
    assert sorted(path.name for path in (done.run_dir / "checkpoints").iterdir()) == checkpoints
    assert len(offline_runs(done.run_dir)) == 1 and "starting afresh" not in bad.output
    afresh = train(*TRAIN, "strategy=single", "trainer.max_epochs=1", "resume=false", run_dir=done.run_dir)
    assert "resume=false: starting afresh, removing the earlier training's checkpoints in" in afresh.output
    runs = offline_runs(afresh.run_dir)
    assert len(runs) == 2, "a new wandb run for the new training"
    assert runs[-1].metric("train/loss") == uninterrupted.metric("train/loss")[: STEPS // 2]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, "-m"]


def test_torchrun_restarts_a_killed_worker_and_the_training_continues_exactly(train, uninterrupted, tmp_path):
    # As launch/torchrun_multinode.sh: each restart meets in a new store (see launcher.warn_if_restarts_can_hang).
    fresh_stores = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    launcher = torchrun("--standalone", "--nproc-per-node=2", "--max-restarts=2")
    overrides = [*TRAIN, "strategy=ddp", *kill_at(7, tmp_path / "killed", rank=1)]
    run = train(*overrides, launcher=launcher, env=fresh_stores, timeout=180)
    assert (tmp_path / "killed").exists(), "rank 1 was killed"
    assert "resuming from" in run.output and "warning: torchrun --max-restarts" not in run.output
    assert "Error executing job" not in run.output, "rank 0's collective failing: one line, not 40 (lost_peer)"
    assert_continues_exactly(run, uninterrupted, starts=2, tolerance=TOLERANCE)


def test_the_torchrun_script_stops_a_refused_command_before_torchrun(tmp_path, train_env):
    """launch/torchrun_multinode.sh checks the command first (check_only=true, with the layout torchrun would give):
    started, torchrun would run a refused command 4 times (--max-restarts=3), then end in a traceback."""
    script = Path(__file__).resolve().parents[1] / "launch/torchrun_multinode.sh"
    command = ["bash", str(script), *TRAIN, "strategy=ddp", "data.batch_size=3"]
    env = {**train_env, "HEAD": "127.0.0.1:29500", "RUN_ID": "refused", "NNODES": "2", "NPROC_PER_NODE": "1"}
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        output = "".join(proc.communicate(timeout=120))
    except subprocess.TimeoutExpired:  # torchrun started, waiting for the second node
        kill_with_descendants(proc)
        raise
    run = Run(proc.returncode, output, tmp_path / "outputs/default/refused")
    run.assert_rejected("data.batch_size=3 is the global batch and must be a positive multiple of the 2 data-parallel")


def start_two_nodes(run_id: str, overrides: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """Two torchrun agents on this machine, rendezvousing as two nodes of one process each (c10d); their output."""
    rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={run_id}"]
    args = [*torchrun("--nnodes=2", "--nproc-per-node=1", *rendezvous)[3:], f"{PACKAGE}.train", *overrides]
    logs = [cwd / f"agent{node}.log" for node in range(2)]
    agents = [start_module("torch.distributed.run", args, env, cwd, log, f"{PACKAGE}.train") for log in logs]
    codes = [agent.wait(300) for agent in agents]
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n".join(output[-3000:] for output in outputs)
    return outputs


def test_two_torchrun_nodes_train_like_one_process_in_one_run_folder(tmp_path, train_env, uninterrupted):
    outputs = start_two_nodes("two-nodes", [*TRAIN, "strategy=ddp"], tmp_path, train_env)
    folders = list((tmp_path / "outputs/default").iterdir())
    assert [folder.name for folder in folders] == ["two-nodes"], "one run folder, named after the rendezvous id"
    run = Run(0, "".join(outputs), folders[0])
    assert run.wandb.config["run"]["num_nodes"] == 2 and run.wandb.config["run"]["world_size"] == 2
    assert_continues_exactly(run, uninterrupted, starts=1, tolerance=TOLERANCE)
    assert os.path.islink(folders[0] / "checkpoints/last.ckpt")


@pytest.mark.parametrize("preset", ["model_parallel", "pipeline"])
def test_model_splitting_presets_span_two_nodes(tmp_path, train_env, uninterrupted, preset):
    """model_parallel: tensor parallel within a node, data parallel across (here 1 x 2); pipeline: a stage a node."""
    start_two_nodes(preset, [*TRAIN, f"strategy={preset}"], tmp_path, train_env)  # the whole run: the LR schedule
    run = Run(0, "", tmp_path / "outputs/default" / preset)  # spans it, so a shorter one would train differently
    assert run.wandb.config["run"]["num_nodes"] == 2
    expected = uninterrupted.metric("train/loss")
    assert run.wandb.metric("train/loss") == pytest.approx(expected, abs=TOLERANCE, rel=0)
    assert (run.run_dir / "checkpoints/last.ckpt").resolve().name == f"step{STEPS:06d}.ckpt"


def test_sbatch_trains_two_processes_and_a_requeued_job_continues_exactly(slurm, tmp_path, train_env, uninterrupted):
    """The shipped launch/slurm.sbatch with 2 tasks on a real (single-host) SLURM; its time-limit signal mid-run."""
    script = Path(__file__).resolve().parents[1] / "launch/slurm.sbatch"
    stalled = tmp_path / "stalled"  # after step 7, past the checkpoint of step 6: nothing more is logged
    stall = ["+callbacks.stall._target_=kill_switch.StallAtStep", "+callbacks.stall.step=7"]
    stall += [f"+callbacks.stall.marker='{stalled}'"]
    submit = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", f"--chdir={tmp_path}"]
    job = subprocess.run(
        [*submit, str(script), *TRAIN, *stall], env=train_env, capture_output=True, text=True, check=True
    ).stdout.strip()
    run_dir = tmp_path / "outputs/default" / job  # named after the job: the same folder after the requeue
    log = tmp_path / f"slurm-{job}.out"
    wait_for(stalled.exists, job, log, "the training to stall after step 7")
    time.sleep(WANDB_FLUSH_SECONDS)  # its steps reach the wandb file (a kill loses the last second)
    # A cluster's pre-emption notice to the tasks: ignored (Lightning's auto-requeue saved in its signal handler,
    # wherever the signal landed: inside a step's all-reduce, a deadlock until the time limit).
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    # What SLURM does 90 s before the time limit (#SBATCH --signal=B:USR1@90): USR1 to the script alone, which
    # requeues the job (scontrol requeue); the tasks, not signalled, are stopped by the requeue.
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    wait_for(lambda: job_state(job) == "PENDING", job, log, "the requeued job to wait in the queue")
    # SLURM holds a requeued job back for a while (about 2 minutes here): let it start again at once.
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
    wait_for(lambda: job_state(job) in ENDED, job, log, "the job to end")
    output = log.read_text() if log.exists() else ""
    assert job_state(job) in ("COMPLETED", "GONE"), output[-4000:]
    assert f"time limit near: requeueing job {job}" in output and "resuming from" in output, output[-4000:]
    assert "Handling auto-requeue signal" not in output and not list(run_dir.glob("hpc_ckpt_*"))
    run = Run(0, output, run_dir)
    assert run.wandb.config["run"]["world_size"] == 2
    assert_continues_exactly(run, uninterrupted, starts=2, tolerance=TOLERANCE)


def _write_over_whole_files(rank: int, folder: Path, port: int, times: int) -> None:
    import torch
    import torch.distributed as dist

    from {{ cookiecutter.package_name }}.engine.strategies.sharded_checkpoints import write_parts
    from {{ cookiecutter.package_name }}.runtime.async_saves import CheckpointWriter

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for i in range(times):
        path = folder / f"last-{i}.ckpt"
        if rank == 0:
            torch.save({"state_dict": {}}, path)  # as ddp leaves "last"
        dist.barrier()
        write_parts({"state_dict": {f"part{rank}": torch.ones(2)}}, path, CheckpointWriter(), rank == 0)
    dist.destroy_process_group()


def test_every_process_writes_its_part_where_another_preset_left_a_whole_file(tmp_path):
    """A training resumed under pipeline/fsdp from ddp's checkpoints saves its folder under the name of ddp's "last"
    file; each process replacing the file itself raced (seen 1 in 4 runs: FileNotFoundError on the second unlink)."""
    import torch.multiprocessing as mp

    mp.spawn(_write_over_whole_files, args=(tmp_path, free_port(), 10), nprocs=2)
    assert all((tmp_path / f"last-{i}.ckpt").is_dir() for i in range(10))


def test_a_checkpoint_of_lightnings_slurm_requeue_is_removed_not_resumed(tmp_path, monkeypatch):
    """SIGUSR1 to the tasks (a cluster's pre-emption notice, --signal=USR1@90) makes Lightning save hpc_ckpt_N.ckpt
    wherever it lands and requeue: the run resumes from its own last checkpoint; Lightning's is removed, as it would
    otherwise restore it by itself in a run that starts afresh there, and it would fill the disk."""
    monkeypatch.delenv("RANK", raising=False)
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"PK")
    prepare_run_folder(tmp_path, None, resume=True)
    assert not (tmp_path / "hpc_ckpt_1.ckpt").exists()


def test_a_moved_run_folder_keeps_its_best_checkpoint(tmp_path):
    """Copied elsewhere and continued in its own folder, a run's state names its old folder: Lightning forgot the
    best, and the test pass after training took a worse checkpoint saved since, silently."""
    old, new = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    new.mkdir(parents=True)
    (new / "best-epoch01-step16.ckpt").touch()  # the folder, moved
    best = str(old / "best-epoch01-step16.ckpt")
    score = torch.tensor(0.5)
    state = {"dirpath": str(old), "best_model_path": best, "best_model_score": score, "kth_value": score,
             "best_k_models": {best: score}, "kth_best_model_path": best, "last_model_path": ""}  # fmt: skip
    moved = ModelCheckpoint(dirpath=str(new), monitor="val/loss")
    moved.load_state_dict(state)
    assert moved.best_model_path == str(new / "best-epoch01-step16.ckpt") and float(moved.best_model_score) == 0.5
    assert list(moved.best_k_models) == [moved.best_model_path]
    other_run = ModelCheckpoint(dirpath=str(tmp_path / "fine-tuned"), monitor="val/loss")  # ckpt_path=: Lightning's
    other_run.load_state_dict(state)
    assert other_run.best_model_score is None, "a run started from another's checkpoint keeps its own best"
