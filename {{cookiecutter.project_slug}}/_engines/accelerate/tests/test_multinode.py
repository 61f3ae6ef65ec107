"""Many machines, and machines that fail: two torchrun agents on this machine rendezvous as two nodes and train
as one data-parallel group would; a worker SIGKILLed mid-epoch makes torchrun restart the group, and a SLURM job
requeued mid-run starts again; both continue from the last checkpoint, exactly."""

import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PACKAGE, TOLERANCE, Run, make_runner
from launchers import free_port, torchrun, torchrun_elastic, torchrun_node
from nets import WANDB_FLUSH_SECONDS
from restarts import RESTARTABLE, STEPS, losses_by_step, run_in
from slurm_jobs import job_state, wait_for
from wandb_records import offline_runs

pytestmark = pytest.mark.slow

DDP = [*RESTARTABLE, "strategy=ddp"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, train_env) -> dict[int, float]:
    """Two processes on one node, nothing killed."""
    run = make_runner(tmp_path_factory.mktemp("uninterrupted"), train_env)(*DDP, launcher=torchrun())
    losses = losses_by_step(run.run_dir)
    assert list(losses) == list(range(STEPS))
    return losses


def test_two_nodes_train_as_one_group_in_one_run_folder(tmp_path, train_env, uninterrupted):
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen(
            [*torchrun_node(2, endpoint, "two-nodes"), f"{PACKAGE}.train", *DDP],
            cwd=tmp_path,
            env=train_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    # One folder, named after the rendezvous id, for both nodes; one wandb run.
    assert [path.name for path in (tmp_path / "outputs" / "default").iterdir()] == ["two-nodes"]
    run_dir = tmp_path / "outputs" / "default" / "two-nodes"
    (wandb,) = offline_runs(run_dir)
    assert wandb.config["run"]["num_nodes"] == 2 and wandb.config["run"]["world_size"] == 2
    # Equal up to the order of floating-point sums: gloo reduces across nodes and within a node differently.
    assert losses_by_step(run_dir) == pytest.approx(uninterrupted, abs=TOLERANCE)


def test_a_killed_worker_is_restarted_and_the_run_continues_exactly(tmp_path, train_env, uninterrupted):
    run_dir = tmp_path / "run"
    kill_rank_1_at_step_7 = [  # after the checkpoint of step 6, mid-epoch
        "model.net._target_=nets.KilledOnce",
        "+model.net.kill_at=7",
        "+model.net.rank=1",
        f"+model.net.marker={tmp_path / 'killed'}",
    ]
    # As launch/torchrun_multinode.sh: each restart meets in a new store (see launcher.warn_if_restarts_can_hang).
    env = {**train_env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    restarts = torchrun_elastic(2, max_restarts=2)
    run = run_in(run_dir, env, *DDP, *kill_rank_1_at_step_7, launcher=restarts, timeout=180)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    # Which failure torchrun names is a race: rank 0 fails on the closed connection within the same monitor
    # interval, and torchrun orders failures by whole seconds (rank 0's then). Both end the group.
    failed = re.search(r"failed \(exitcode: (-9\) local_rank: 1|1\) local_rank: 0) ", output)
    assert (tmp_path / "killed").exists() and failed, "rank 1 was killed, and the group with it"
    assert "step-0000006" in output, "the restarted group resumed from the checkpoint of step 6"
    assert "warning: torchrun --max-restarts" not in output
    (wandb,) = offline_runs(run_dir)
    assert wandb.starts == 2, "one wandb run, continued once by the restarted group"
    assert losses_by_step(run_dir) == uninterrupted


def test_the_torchrun_script_stops_a_refused_command_before_torchrun(tmp_path, train_env):
    """launch/torchrun_multinode.sh checks the command first (check_only=true, with the layout torchrun would give):
    started, torchrun would run a refused command 4 times (MAX_RESTARTS=3), then end in a traceback."""
    script = Path(__file__).resolve().parents[1] / "launch" / "torchrun_multinode.sh"
    env = {**train_env, "HEAD": f"127.0.0.1:{free_port()}", "RUN_ID": "refused", "NNODES": "1", "NPROC_PER_NODE": "2"}
    command = ["bash", str(script), *DDP, "data.batch_size=3"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    run = Run(done.returncode, done.stdout + done.stderr, tmp_path / "outputs" / "default" / "refused")
    run.assert_rejected("data.batch_size=3 is the global batch and must be a positive multiple of the 2 data-parallel")


def test_resumed_on_one_process_the_run_continues_with_the_same_global_batch(tmp_path, train_env, uninterrupted):
    """Decided, as in the Lightning engine: a data-parallel run may resume on another number of processes (the
    global batch, hence each step's samples, does not depend on it). Killed right after the checkpoint at the end
    of its first epoch, the 2-process run goes on in one process, with the same losses."""
    run_dir = tmp_path / "run"
    kill_rank_1_at_step_8 = [  # the first step of the second epoch
        "model.net._target_=nets.KilledOnce",
        "+model.net.kill_at=8",
        "+model.net.rank=1",
        f"+model.net.marker={tmp_path / 'killed'}",
    ]
    killed = run_in(run_dir, train_env, *DDP, *kill_rank_1_at_step_8, launcher=torchrun())
    assert killed.returncode != 0 and (tmp_path / "killed").exists(), killed.stdout + killed.stderr
    assert (run_dir / "checkpoints" / "last").resolve().name == "step-0000008"
    one = run_in(run_dir, train_env, *RESTARTABLE, "strategy=single", *kill_rank_1_at_step_8)
    assert one.returncode == 0, one.stdout + one.stderr
    assert "the checkpoint holds the random state of 2 processes, this run has 1" in one.stderr
    assert losses_by_step(run_dir) == pytest.approx(uninterrupted, abs=TOLERANCE)


SLURM_SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "slurm.sbatch"


def test_a_requeued_slurm_job_continues_exactly(slurm, tmp_path, train_env, uninterrupted):
    """launch/slurm.sbatch as the README gives it (1 node x 2 processes); the time limit's signal while the job
    runs, after its checkpoint of step 6: the script requeues the job, which starts again, in the same run folder,
    and continues exactly."""
    stalled = tmp_path / "stalled"
    stall_at_step_7 = ["model.net._target_=nets.StalledOnce", "+model.net.stall_at=7", f"+model.net.marker={stalled}"]
    submit = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", f"--chdir={tmp_path}", str(SLURM_SCRIPT)]
    job = subprocess.run([*submit, *DDP, *stall_at_step_7], env=train_env, capture_output=True, text=True, check=True)
    job_id = job.stdout.strip().split(";")[0]
    log = tmp_path / f"slurm-{job_id}.out"
    wait_for(stalled.exists, job_id, log, "the training to stall after step 7")
    time.sleep(WANDB_FLUSH_SECONDS)  # a kill loses up to a second of wandb metrics (see nets.kill_once)
    # What SLURM does 90 s before the time limit (#SBATCH --signal=B:USR1@90): USR1 to the script alone, which
    # requeues the job (scontrol requeue).
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    wait_for(lambda: job_state(job_id) == "PENDING", job_id, log, "the requeued job to wait in the queue")
    # SLURM holds a requeued job back for a while (about 2 minutes here): let it start again at once.
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
    wait_for(lambda: job_state(job_id) == "COMPLETED", job_id, log, "the job to complete")
    output = log.read_text()
    assert job_state(job_id) == "COMPLETED", output[-4000:]
    assert "Restarts=1" in subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    run_dir = tmp_path / "outputs" / "default" / job_id  # named after the job, which keeps its id when requeued
    assert f"time limit near: requeueing job {job_id}" in output
    assert "resuming from" in output and "step-0000006" in output
    (wandb,) = offline_runs(run_dir)
    assert wandb.starts == 2, "one wandb run, continued by the requeued job"
    assert losses_by_step(run_dir) == uninterrupted
