"""Many machines, and a machine that fails, under torchrun: two torchrun agents on this machine rendezvous as
two nodes and train as one data-parallel group would; a worker SIGKILLed mid-epoch makes torchrun restart the
group, which continues from the last checkpoint, exactly."""

import subprocess

import pytest
from conftest import PACKAGE, TOLERANCE, make_runner
from launchers import free_port, torchrun, torchrun_elastic, torchrun_node
from restarts import RESTARTABLE, STEPS, losses_by_step, run_in
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
    run = run_in(run_dir, train_env, *DDP, *kill_rank_1_at_step_7, launcher=torchrun_elastic(2, max_restarts=2))
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert (tmp_path / "killed").exists() and "exitcode: -9" in output, "rank 1 was killed, and restarted"
    assert "step-0000006" in output, "the restarted group resumed from the checkpoint of step 6"
    (wandb,) = offline_runs(run_dir)
    assert wandb.starts == 2, "one wandb run, continued by the restarted group"
    assert losses_by_step(run_dir) == uninterrupted
