"""A training stopped before its end continues exactly, in one wandb run: killed at once with every process (wandb's
too), it logs again from the run's metrics file the steps wandb lost; stopped with Ctrl-C, it finishes the step under
way, saves a checkpoint there and says in one line how to continue (exit 130), and the same command with
run_id=last continues it (a finished run is not continued); several processes stop together at a logged step."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PACKAGE, QUICK, TOLERANCE, as_single, make_runner, next_main_port, refuse_all
from engine_specific import DDP, DDP_LAUNCH, LAST, best_step, kept_checkpoints
from forked import ForkedCommand, can_fork, start_module
from own_models import paused
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


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, train_env) -> Path:
    """The run folder of the training run once, uninterrupted, keeping its 2 newest checkpoints."""
    return make_runner(tmp_path_factory.mktemp("whole"), train_env)(*SETTINGS, "checkpoint.keep_last=2").run_dir


@pytest.fixture(scope="module")
def whole(whole_run) -> dict[int, float]:
    """train/loss by step of the uninterrupted run (the losses are the same whatever checkpoints it keeps)."""
    run_dir = whole_run
    losses_by_step = losses(run_dir)
    assert list(losses_by_step) == list(range(STEPS))
    kept, best = kept_checkpoints(run_dir)  # saved after steps 3, 6, 8 (the epoch's end), 9, 12, 15 and 16
    assert kept[-2:] == [15, 16] and set(kept) - {15, 16} <= {best}, (kept, best)
    return losses_by_step


def test_a_hard_kill_of_the_whole_job_loses_no_step(tmp_path, train_env, whole):
    train = make_runner(tmp_path, train_env)

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
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    in_file = [(row["trainer/global_step"], row["train/loss"]) for row in rows if "train/loss" in row]
    assert in_file == list(whole.items()), "metrics.jsonl: every step once, in order, with the same values"


def test_a_checkpoint_cut_mid_epoch_is_refused_with_a_batch_it_does_not_end_on(tmp_path, train_env, whole_run):
    """ckpt_path= with another global batch (fine-tuning): its batches must end where the epoch stopped. Refused
    before anything is written; it was said in one line, but after wandb had started in a new run folder."""
    [mid_epoch] = (whole_run / "checkpoints").glob("step*15*")  # 7 of the second epoch's 8 steps of 64
    [run] = refuse_all(tmp_path, train_env, [[*SETTINGS, f"ckpt_path={mid_epoch}", "data.batch_size=40"]])
    run.assert_rejected("the checkpoint stopped after 448 samples of epoch 1, which is not a whole number of global")


def test_a_checkpoint_cut_mid_epoch_continues_exactly_with_its_batch_accumulated(tmp_path, train_env, whole_run, whole):
    """ckpt_path= with trainer.accumulate_grad_batches=2, the same global batch in 2 micro-batches: the step after the
    checkpoint trains the global batch the uninterrupted run did, and the epoch ends there. Both engines counted the
    checkpoint's batches as micro-batches: the first step trained one micro-batch (half the loss), the next the rest."""
    [mid_epoch] = (whole_run / "checkpoints").glob("step*15*")  # 7 of the second epoch's 8 steps of 64
    run = make_runner(tmp_path, train_env)(*SETTINGS, f"ckpt_path={mid_epoch}", "trainer.accumulate_grad_batches=2")
    assert losses(run.run_dir) == pytest.approx({15: whole[15]}, abs=TOLERANCE)


def test_a_training_that_max_steps_stops_inside_an_epoch_validates_its_last_steps(tmp_path, train_env):
    """Stopped at step 12 of 16, in the second epoch: its last 4 steps were never validated, so the best checkpoint
    and the test pass (and a search's value) were the first epoch's weights', logged at step 12 as if the last's."""
    run = make_runner(tmp_path, train_env)(*SETTINGS, "trainer.max_steps=12", "test_after_fit=true")
    (logged,) = offline_runs(run.run_dir)
    assert logged.steps("val/loss") == [7, 11], "each epoch's end, and where it stopped"
    first, last = logged.metric("val/loss")
    assert last < first and best_step(run.run_dir) == 12, "the best: the last weights, validated"
    assert logged.steps("test/loss") == [12]


def train_in(cwd, env, *overrides: str, launcher: list[str] | None = None) -> tuple[int, str]:
    """The training command run in `cwd` as a user runs it: its run folder is outputs/<experiment>/<run id>/."""
    overrides = tuple(as_single(list(overrides)))  # (the bake's default preset may be another)
    if can_fork(env) and launcher is None:
        proc = ForkedCommand(f"{PACKAGE}.train", list(overrides), env, cwd, cwd / f"log{len(list(cwd.glob('log*')))}")
        return proc.wait(300), proc.output()
    done = subprocess.run([*(launcher or [sys.executable, "-m"]), f"{PACKAGE}.train", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_ctrl_c_saves_then_run_id_last_continues_exactly(tmp_path, train_env, whole):
    net = ["model.net._target_=own_models.InterruptedOnce", f"+model.net.marker={tmp_path / 'once'}"]
    command = ["experiment=ctrl-c", *SETTINGS, *net, "trainer.log_every_n_steps=3"]

    code, output = train_in(tmp_path, train_env, *command)  # Ctrl-C in the forward of step 5 (index 4)
    [run_dir] = (tmp_path / "outputs" / "ctrl-c").iterdir()
    assert code == 130, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        f"interrupted after step 5, saved in {run_dir / LAST}: continue with the same command "
        f"plus run_id={run_dir.name} (or run_id=last)"
    )
    assert "Traceback" not in output

    code, output = train_in(tmp_path, train_env, *command, "run_id=last")
    assert code == 0, output[-3000:]
    assert f"run_id=last: continuing {run_dir.relative_to(tmp_path)}" in output
    starts = [json.loads(line) for line in (run_dir / "starts.jsonl").read_text().splitlines()]  # each start's record
    assert [start["resumed_from"] is None for start in starts] == [True, False], starts
    assert "experiment=ctrl-c" in starts[1]["overrides"] and "torch" in starts[1]["versions"], starts[1]
    logged = losses(run_dir)  # every 3rd step, and the step it stopped after (both engines: Lightning's way)
    assert list(logged) == [2, 4, 5, 8, 11, 14], list(logged)
    assert logged == {step: whole[step] for step in logged}, "the continued run's steps equal the uninterrupted run's"
    (run,) = offline_runs(run_dir)
    assert len(run.steps("val/loss")) == 2, "validated at each epoch's end only, as when not stopped"
    checkpoints = run_dir / "checkpoints"
    assert kept_checkpoints(run_dir)[0] == [STEPS], "checkpoint.keep_last=1: the one saved at the stop is gone too"
    assert len(list(checkpoints.glob("best*"))) == 1, sorted(checkpoints.iterdir())

    code, output = train_in(tmp_path, train_env, *command, "run_id=last")
    assert code == 2 and f"error: run_id=last: the newest run of experiment=ctrl-c, {run_dir.name}, finished" in output


def test_ctrl_c_of_several_processes_stops_them_together_at_a_logged_step(tmp_path, train_env, whole):
    """Two processes, asked to stop during step 7, not necessarily at once: by a Ctrl-C where the command runs,
    which passes it on to torchrun, which passes it on to each process and its loader workers (the Accelerate
    engine's processes started by the command itself), or by `kill -INT` to one and its loader workers (Lightning's
    own processes: the second). The workers leave it to the training, which validates at
    the epoch's end (step 8) on, and agrees at the next logged step (every 5th) to stop, saves it, and says how to
    continue; the continued run trains the steps an uninterrupted one does."""
    net = ["model.net._target_=own_models.InterruptedOnce", f"+model.net.marker={tmp_path / 'once'}", "+model.net.at=6"]
    to = ["+model.net.only_rank=0", "+model.net.to_command=true"]
    to = to if DDP_LAUNCH else ["+model.net.only_rank=1", "+model.net.children=true"]
    command = ["experiment=ctrl-c", *SETTINGS, *DDP, *net, *to, "data.num_workers=1", "trainer.log_every_n_steps=5"]

    code, output = train_in(tmp_path, ddp_env(train_env), *command)  # (both engines start their processes)
    [run_dir] = (tmp_path / "outputs" / "ctrl-c").iterdir()
    stops = [line for line in output.splitlines() if line.startswith("interrupted after step")]
    assert len(stops) == 1, output[-3000:]
    step = int(stops[0].split()[3].rstrip(","))  # the launcher's Ctrl-C reaches them a moment later
    assert stops[0] == (
        f"interrupted after step {step}, saved in {run_dir / LAST}: continue with the same command plus "
        f"run_id={run_dir.name} (or run_id=last)"
    )
    assert step % 5 == 0 and 7 <= step < STEPS, step
    assert code == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]  # (the Accelerate engine's torchrun printed its own, 30 lines)

    code, output = train_in(tmp_path, ddp_env(train_env), *command, "run_id=last")
    assert code == 0, output[-3000:]
    logged = losses(run_dir)
    assert list(logged) == list(range(4, STEPS, 5)), "every 5th step, each once, in one wandb run"
    assert logged == pytest.approx({step: whole[step] for step in logged}, abs=TOLERANCE), "as single's"


def ddp_env(env: dict[str, str]) -> dict[str, str]:
    return env if DDP_LAUNCH else {**env, "MASTER_PORT": str(next_main_port())}  # (conftest.next_main_port)


def test_a_stop_that_reaches_wandbs_service_too_says_how_to_continue(tmp_path, train_env, whole):
    """SLURM's scancel and requeue signal every process of the job step: wandb's service stops with the training,
    which cannot log or close its wandb run any more. It still stops after the step with a checkpoint and says in
    one line how to continue (exit 130), and the continued run logs what wandb lost, each step once."""
    net = ["model.net._target_=own_models.InterruptedOnce", f"+model.net.marker={tmp_path / 'once'}"]
    command = ["experiment=scancel", *SETTINGS, *net, "+model.net.signal_name=SIGTERM", "+model.net.children=true"]
    code, output = train_in(tmp_path, train_env, *command)
    [run_dir] = (tmp_path / "outputs" / "scancel").iterdir()
    assert code == 130 and "Traceback" not in output, output[-3000:]
    assert "wandb: its service stopped with this process" in output
    assert output.strip().splitlines()[-1].startswith("interrupted after step 5, saved in")
    code, output = train_in(tmp_path, train_env, *command, f"run_id={run_dir.name}")
    assert code == 0, output[-3000:]
    assert losses(run_dir) == whole


def test_ctrl_c_while_the_training_starts_says_how_to_continue(tmp_path, train_env):
    """Before the training answers Ctrl-C (the data, the model, wandb starting): it was a 90-line traceback."""
    code, output = train_in(tmp_path, train_env, *SETTINGS, "model.net._target_=own_models.CtrlCWhileBuilt", "run_id=c")
    assert code == 130 and "Traceback" not in output, output[-3000:]
    assert output.strip().splitlines()[-1] == (  # (not "continue ... run_id=last": it would be another run's)
        "interrupted, at once: it saved no checkpoint to continue from; run the command again to start over"
    )


FIRST_EVALUATION = ["model.net._target_=own_models.InterruptedOnce", "+model.net.in_eval=true", "+model.net.at=0"]


@pytest.mark.parametrize(
    "net, signal_name, processes",
    [
        (["model.net._target_=own_models.CtrlCWhileBuilt"], "SIGTERM", []),  # before any step
        (FIRST_EVALUATION, "SIGTERM", []),
        # every process, not the command (Lightning's second: quiet, exit 0, as Interrupted says; the Accelerate
        # engine's torchrun printed its 30-line report of the processes' exit 130)
        (FIRST_EVALUATION, "SIGINT", DDP),
    ],
    ids=["starting", "first-evaluation", "first-evaluation-of-2-processes"],
)
def test_a_stop_outside_the_steps_is_said_once_with_a_non_zero_exit(tmp_path, train_env, net, signal_name, processes):
    """`kill PID` while the training starts (the Accelerate engine's process ended silently, exit 143) or in its first
    evaluation (Lightning's sanity check, before its steps answer it: exit 0 after training nothing, which a
    scheduler counts a success; a Ctrl-C there: exit 1 without a word)."""
    marker = [f"+model.net.marker={tmp_path / 'once'}"] if "in_eval" in str(net) else []
    command = [*SETTINGS, *net, *marker, f"+model.net.signal_name={signal_name}", *processes, "run_id=t"]
    code, output = train_in(tmp_path, ddp_env(train_env) if processes else train_env, *command)
    assert code == 130 and "Traceback" not in output, output[-3000:]
    said = [line for line in output.splitlines() if line.startswith("interrupted")]
    if processes and DDP_LAUNCH:  # the command's, last (its first process's may be stopped by torchrun before it)
        assert said and said[-1].startswith("interrupted: continue with the same command"), output[-3000:]
    else:
        assert len(said) == 1 and output.strip().endswith(said[0]), output[-3000:]


def test_a_run_folder_removed_under_the_training_is_said_in_one_line(tmp_path, train_env):
    """It was the 40-line traceback of the next file written there (metrics.jsonl's); where every later write made the
    folder again (Lightning's), the training ended "finished", exit 0, its config, starts and wandb run lost."""
    code, output = train_in(tmp_path, train_env, *SETTINGS, "model.net._target_=own_models.RemovesItsRunFolder")
    assert "Traceback" not in output, output[-3000:]
    said = output.strip().splitlines()[-1]
    assert code == 1 and said.startswith("error: the run folder "), output[-3000:]
    assert said.endswith(" was removed while the training ran: start it again")


def test_a_worker_stops_when_its_torchrun_agent_is_killed(tmp_path, train_env):
    """kill -9 of a node's torchrun (its agent): the worker, which torchrun starts in a session of its own, stops
    with it. It trained on as an orphan, writing checkpoints and metrics that the restarted run disagreed with."""
    net = ["model.net._target_=own_models.PausedOnce", f"+model.net.marker={tmp_path / 'pause'}"]
    agent_command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m"]
    command = [*agent_command, f"{PACKAGE}.train", f"hydra.run.dir={tmp_path / 'run'}", *as_single([*SETTINGS, *net])]
    with open(tmp_path / "agent.log", "w") as log:
        agent = subprocess.Popen(command, env=train_env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert paused(tmp_path / "pause", agent), (tmp_path / "agent.log").read_text()[-3000:]
        worker = int((tmp_path / "pause.paused").read_text())
        agent.kill()
        agent.wait()
        for _ in range(200):
            if not running(worker):
                break
            time.sleep(0.05)
        assert not running(worker), "the worker trains on without its agent"
    finally:
        (tmp_path / "pause.go").touch()


def test_a_worker_whose_agent_died_while_it_started_stops(tmp_path, train_env):
    """torchrun's process group killed while its worker still imports (kill -9 of the group does not reach the
    worker's session): the worker stops once started, writing nothing. It took the process that adopted it for its
    agent, and trained the whole run as an orphan, beside the same command started again."""
    agent_command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m"]
    command = [
        *agent_command,
        "slow_start",
        f"{PACKAGE}.train",
        f"hydra.run.dir={tmp_path / 'run'}",
        *as_single(SETTINGS),
    ]
    env = {**train_env, "SLOW_START_MARKER": str(tmp_path / "start")}
    with open(tmp_path / "agent.log", "w") as log:
        agent = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert paused(tmp_path / "start", agent), (tmp_path / "agent.log").read_text()[-3000:]
        worker = int((tmp_path / "start.paused").read_text())
        agent.kill()
        agent.wait()
    finally:
        (tmp_path / "start.go").touch()
    for _ in range(1200):
        if not running(worker):
            break
        time.sleep(0.05)
    assert not running(worker), "the worker trains on without its agent"
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def running(pid: int) -> bool:
    """Whether process `pid` runs (an orphan that ended may stay a zombie where nothing reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def written(run_dir) -> tuple[str, list]:
    """What a training writes in its run folder as it trains: its metrics file, its checkpoints."""
    return (run_dir / "metrics.jsonl").read_text(), sorted((run_dir / "checkpoints").iterdir())


def test_a_second_training_in_the_run_folder_of_a_running_one_is_refused(tmp_path, train_env, whole):
    """The same command twice at once (one run_id): the second is refused in one line and writes nothing; the first
    trains on, its steps each logged once, as if alone."""
    net = ["model.net._target_=own_models.PausedOnce", f"+model.net.marker={tmp_path / 'pause'}"]
    command = as_single(["experiment=twice", "run_id=one", *SETTINGS, *net])
    first = start_module(f"{PACKAGE}.train", command, train_env, tmp_path, tmp_path / "first.log", f"{PACKAGE}.train")
    try:
        assert paused(tmp_path / "pause", first), (tmp_path / "first.log").read_text()[-3000:]
        run_dir = tmp_path / "outputs" / "twice" / "one"
        before = written(run_dir)
        code, output = train_in(tmp_path, train_env, *command)
        assert code == 2 and "Traceback" not in output, output[-3000:]
        [error] = [line for line in output.splitlines() if line.startswith("error:")]
        assert error.startswith(f"error: another training is running in {run_dir.resolve()}"), error
        assert written(run_dir) == before, "the refused training wrote into the run folder"
        code, output = train_in(tmp_path, train_env, *command, "check_only=true")  # writes nothing: not refused
        assert code == 0 and "check_only: the command passes its checks" in output, output[-3000:]
    finally:
        (tmp_path / "pause.go").touch()
    assert first.wait(300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert losses(run_dir) == whole
