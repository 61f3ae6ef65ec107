"""Layouts given by a launcher (torchrun, SLURM), checked against the command line before training."""

import contextlib
import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import QUICK
from engine_specific import DDP
from layouts import torchrun
from slurm_jobs import ENDED, job_state, wait_for

from {{ cookiecutter.package_name }} import errors
from {{ cookiecutter.package_name }}.config.command_line import check_output_folder
from {{ cookiecutter.package_name }}.errors import ERROR_FILE, ConfigError, first_to_say
from {{ cookiecutter.package_name }}.parallel.launcher import (
    check_run_id,
    check_srun_tasks_joined,
    detect_launcher,
    fit_layout_to_launcher,
    lost_peer,
    shipped_devices,
    started_alone,
    warn_if_restarts_can_hang,
)
from {{ cookiecutter.package_name }}.runtime.hardware import oversubscribed_note

TORCHRUN_2x2 = {"TORCHELASTIC_RUN_ID": "job", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"}
SLURM_1x2 = {"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1", "SLURM_JOB_NAME": "job"}


@pytest.fixture
def launched_by(monkeypatch):
    for name in {*TORCHRUN_2x2, *SLURM_1x2, "ACCELERATE_MIXED_PRECISION"}:
        monkeypatch.delenv(name, raising=False)

    def set_env(env: dict[str, str]) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_no_launcher_keeps_the_configured_layout(launched_by):
    assert detect_launcher() is None
    assert fit_layout_to_launcher("ddp", 1, 2, ["trainer.devices=2"]) == (1, 2)


@pytest.mark.parametrize(("env", "layout"), [(TORCHRUN_2x2, (2, 2)), (SLURM_1x2, (1, 2))])
def test_a_launcher_gives_the_layout_when_the_command_line_does_not(launched_by, env, layout):
    launched_by(env)
    assert fit_layout_to_launcher("ddp", 1, "auto", ["strategy=ddp"]) == layout
    assert fit_layout_to_launcher("ddp", 1, "auto", ["trainer.devices=auto"]) == layout
    nodes, devices = layout
    assert fit_layout_to_launcher("ddp", nodes, devices, [f"trainer.num_nodes={nodes}"]) == layout


def test_a_layout_that_contradicts_the_launcher_is_refused_naming_both(launched_by):
    launched_by(TORCHRUN_2x2)
    message = r"trainer.num_nodes=1 x trainer.devices=2 = 2 processes, but torchrun runs 4 \(2 nodes x 2\)"
    with pytest.raises(ConfigError, match=message):
        fit_layout_to_launcher("ddp", 1, 2, ["trainer.num_nodes=1"])
    launched_by({"ACCELERATE_MIXED_PRECISION": "no"})  # accelerate launch (torch's agent): named as the user typed
    with pytest.raises(ConfigError, match="but accelerate launch runs 4"):
        fit_layout_to_launcher("ddp", 1, 2, ["trainer.num_nodes=1"])


def test_a_configured_count_gives_way_to_the_launcher_with_a_note(launched_by, capsys):
    """A preset's trainer.devices (a copy of ddp.yaml with 4) under a launcher of 2 per node: the launcher's layout,
    and a note saying so (the run went on with 2 without a word)."""
    launched_by({**TORCHRUN_2x2, "RANK": "0"})
    assert fit_layout_to_launcher("ddp", 1, 4, ["strategy=ddp4"]) == (2, 2)
    note = "note: trainer.devices=4 (from the config) gives way to the 2 processes per node torchrun started"
    assert note in capsys.readouterr().err
    shipped = shipped_devices("ddp")  # the project's own ddp.yaml's (Lightning: auto), else the trainer's 1
    assert fit_layout_to_launcher("ddp", 1, shipped, ["strategy=ddp"]) == (2, 2)  # nothing of yours to say
    assert capsys.readouterr().err == ""


def test_one_process_of_a_launcher_is_told_how_that_launcher_starts_more(launched_by, monkeypatch):
    """A preset of several processes run as one: the advice names the launcher that started it (it said to give
    trainer.devices=N, which a launcher's layout refuses), or None for a command started by hand."""
    assert started_alone() is None
    launched_by({"ACCELERATE_MIXED_PRECISION": "no"})  # accelerate launch without its config: ran the command itself
    assert started_alone().startswith("accelerate launch started 1 (it does with --cpu or a config's use_cpu: true,")
    launched_by({"TORCHELASTIC_RUN_ID": "job"})
    assert started_alone() == "accelerate launch started 1: give it --num_processes N"
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert started_alone().startswith("torchrun started 1: give it --nproc-per-node=N (NPROC_PER_NODE=N for")
    launched_by({"TORCHELASTIC_RESTART_COUNT": "1"})  # the one process left of an elastic job, or one restarted
    assert started_alone().startswith("torchrun restarted it as 1 (all that is left of an elastic --nnodes=MIN:MAX")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    launched_by({"SLURM_JOB_ID": "7"})  # launch/slurm.sbatch: torchrun on each machine
    assert started_alone().startswith("SLURM gave it 1 per machine: give sbatch --ntasks-per-node=N")


def test_srun_tasks_that_would_each_train_alone_are_refused(monkeypatch):
    """srun -n 2 of a command whose processes do not join one training (Accelerate's without torchrun, Lightning's
    single, or in a job Lightning does not take for SLURM: salloc's): each task trained alone into the one run
    folder, every metric row twice, two wandb runs. It was a note."""
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setattr(errors, "started_by_slurm_step", lambda: True)  # (srun's tasks: slurmstepd's children)
    with pytest.raises(ConfigError, match=r"^srun started 2 tasks that do not join one training: each would train"):
        check_srun_tasks_joined(joined=False)
    check_srun_tasks_joined(joined=True)  # launch/slurm.sbatch's: under torchrun, or Lightning's SLURM processes
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    check_srun_tasks_joined(joined=False)  # srun -n1, a plain sbatch: one training
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setattr(errors, "started_by_slurm_step", lambda: False)
    check_srun_tasks_joined(joined=False)  # a command typed in `srun -n 2 --pty bash`'s shell: one process


def test_more_processes_than_cores_are_said(monkeypatch):
    """ddp_spawn trainer.devices=64 on 2 cores trained, slower than one process, without a word."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert oversubscribed_note(2) is None
    assert oversubscribed_note(3) == (
        "note: 3 training processes on the CPU of a machine with 2 cores: each step waits for processes that have no "
        "core; trainer.devices=2 or fewer trains faster here"
    )


@pytest.mark.parametrize("preset", ["dp", "ddp_spawn"])
def test_single_machine_presets_are_refused_under_a_launcher_and_over_nodes(launched_by, preset):
    with pytest.raises(ConfigError, match=f"strategy={preset} .*, so not on trainer.num_nodes=2; use strategy=ddp"):
        fit_layout_to_launcher(preset, 2, 1, [])
    launched_by(SLURM_1x2)
    with pytest.raises(ConfigError, match=f"strategy={preset} .* so not under SLURM; use strategy=ddp"):
        fit_layout_to_launcher(preset, 1, 1, [])


def test_several_nodes_without_a_run_id_are_refused(launched_by):
    launched_by({**TORCHRUN_2x2, "TORCHELASTIC_RUN_ID": "none"})
    with pytest.raises(ConfigError, match="give run_id=NAME"):
        check_run_id(["strategy=ddp"])
    check_run_id(["run_id=mine"])


@pytest.mark.parametrize(
    "env, warned",
    [
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3", "RANK": "0"}, True),
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3", "RANK": "1"}, False),  # rank 0's
        ({"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_MAX_RESTARTS": "3", "RANK": "0"}, False),  # new stores
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "0", "RANK": "0"}, False),
    ],
)
def test_a_torchrun_whose_restarts_can_hang_is_named(monkeypatch, capsys, env, warned):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    warn_if_restarts_can_hang()
    said = capsys.readouterr().err
    assert ("export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun" in said) == warned
    assert said.count("\n") == int(warned), "one line"


@pytest.mark.slow
def test_a_refusal_under_torchrun_is_said_once_per_machine_and_named_as_the_root_cause(train):
    """Every process refuses the batch before they can talk to each other: the first on the machine says it; the
    others write it where torchrun's failure report reads it (its root cause, not "To enable traceback see")."""
    run = train("strategy=ddp", "data.batch_size=3", "trainer.accelerator=cpu", launcher=torchrun(2), check=False)
    refusal = "error: data.batch_size=3 is the global batch and must be a positive multiple of the 2 data-parallel"
    said = [line for line in run.output.splitlines() if line.startswith(refusal)]
    assert run.returncode != 0 and len(said) == 1, run.output
    root_cause = run.output.split("Root Cause (first observed failure):")[1]
    assert f"traceback : {refusal}" in root_cause and "To enable traceback" not in run.output


def test_a_quoted_run_folder_is_checked_as_hydra_reads_it(tmp_path):
    """hydra.run.dir="..." (a folder with spaces; Lightning gives its other processes the folder so): the quotes were
    taken as part of the path, a relative one, and from a read-only working folder every ddp run was refused."""
    a_file = tmp_path / "a file"
    a_file.touch()
    check_output_folder([f'hydra.run.dir="{tmp_path}/my runs/1"'])
    with pytest.raises(ConfigError, match=f"the run folder {a_file}/run cannot be made: {a_file} is a file"):
        check_output_folder([f'hydra.run.dir="{a_file}/run"'])


def test_a_refused_or_checked_sweep_leaves_no_folder(train, tmp_path):
    """A --multirun whose first job is refused, or that is only checked (check_only=true writes nothing), left its
    sweep folder with Hydra's multirun.yaml; a refused run under hydra.job.chdir=true its run folder."""
    refused = train("hydra.mode=MULTIRUN", "data.batch_size=7,8", *DDP, "trainer.accelerator=cpu", check=False)
    assert refused.returncode == 2 and "data.batch_size=7 is the global batch" in refused.output, refused.output
    checked = train("hydra.mode=MULTIRUN", "data.batch_size=8,16", "check_only=true")
    assert checked.output.count("check_only: the command passes its checks") == 2, checked.output
    assert not (tmp_path / "outputs").exists(), sorted(tmp_path.rglob("*"))
    # run in its own folder (hydra.job.chdir=true), a refused run left it: the process's working folder
    moved = train("hydra.job.chdir=true", "data.batch_size=0", check=False)
    moved.assert_rejected("data.batch_size=0 is the global batch")


@pytest.mark.slow
def test_a_multirun_of_ddp_trainings_trains_each_job_in_its_own_folder(train, tmp_path):
    """Lightning started a ddp job's other process with the whole command line: it ran the whole sweep, in a sweep
    folder of its own, its second job joining the next job's first process (whose LOCAL_RANK, left set, said its
    processes were started already: alone, it waited for ever). A folder with a space and an é: its processes are
    given it quoted."""
    sweep = ["hydra.mode=MULTIRUN", "model.optimizer.lr=0.001,0.003", *DDP, "trainer.accelerator=cpu"]
    sweep += ["trainer.max_steps=2", 'run_id="équipe ü"']  # (Accelerate's own launch gave torchrun the é unquoted)
    # (as typed: a new interpreter, whose children are too, not the tests' forks of one)
    run = train(*sweep, "trainer.log_every_n_steps=1", "test_after_fit=false", env={"STARTS_NEW_INTERPRETER": "1"})
    [folder] = (tmp_path / "outputs" / "default").iterdir()
    assert sorted(path.name for path in folder.iterdir()) == ["0", "1", "multirun.yaml"], run.output[-3000:]
    for job, lr in enumerate((0.001, 0.003)):
        logged = [json.loads(line) for line in (folder / str(job) / "metrics.jsonl").read_text().splitlines()]
        assert (folder / str(job) / "finished").is_file()
        assert [row["train/lr"] for row in logged if "train/lr" in row][0] == pytest.approx(lr / 10)  # (warmup)
        wandb_folder = shlex.quote(str(folder / str(job) / "wandb"))  # (a command to paste: the space quoted)
        assert f"upload it with: wandb sync {wandb_folder}\n" in run.output


@pytest.mark.parametrize(
    "head, error",
    [
        ("127.0.0.1", "error: HEAD=127.0.0.1 has no port: give HEAD=<first machine>:<port>, e.g. node0:29500"),
        ("nosuchhost.invalid:29500", "error: HEAD=nosuchhost.invalid:29500: the machine nosuchhost.invalid is not"),
    ],
    ids=["no-port", "unknown-machine"],
)
def test_the_torchrun_script_refuses_a_head_torchrun_would_wait_on_for_ever(tmp_path, train_env, head, error):
    """torchrun takes a HEAD without a port (its default port) or a machine that does not resolve, and waits."""
    script = Path(__file__).resolve().parents[1] / "launch" / "torchrun_multinode.sh"
    env = {**train_env, "HEAD": head, "RUN_ID": "refused"}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith(error) and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_preset_file_is_the_built_in_preset_whose_strategy_class_it_keeps():
    """A preset file of yours is the built-in preset with its strategy class: as written in the built-in file, by
    another path to the same class, or a subclass of it; ddp_spawn's kind by its start method (Lightning). A class
    no preset has keeps its own name (the built-in checks skip it, as before)."""
    from omegaconf import OmegaConf

    from {{ cookiecutter.package_name }}.parallel.presets import BUILT_IN, STRATEGY_CONFIGS, built_in_classes, built_in_preset

    assert sorted(built_in_classes().values()) == sorted(BUILT_IN), "each built-in preset its own strategy class"
    for name in BUILT_IN:
        strategy = OmegaConf.load(STRATEGY_CONFIGS / f"{name}.yaml").strategy
        assert built_in_preset(f"my_{name}", strategy) == name, name
    ddp = OmegaConf.load(STRATEGY_CONFIGS / "ddp.yaml").strategy
    ddp_class = next(found for (found, _), name in built_in_classes().items() if name == "ddp")  # (imported)
    by_its_module = {**ddp, "_target_": f"{ddp_class.__module__}.{ddp_class.__qualname__}"}
    assert built_in_preset("ddp4", by_its_module) == "ddp"
    subclass = type("MyDDP", (ddp_class,), {})
    globals()["MyDDP"] = subclass  # importable as test_launcher.MyDDP
    assert built_in_preset("ddp4", {**ddp, "_target_": f"{__name__}.MyDDP"}) == "ddp"
    assert built_in_preset("mine", {"_target_": "my.OwnStrategy"}) == "mine"


def test_hydras_options_keep_their_values_and_a_bare_word_is_refused():
    """A bare word is refused (`train ddp`: Hydra's four lines), but not the value of a Hydra option, abbreviated
    as argparse takes it too (`--config-n best`)."""
    from {{ cookiecutter.package_name }}.config.command_line import check_flags

    check_flags(["--config-n", "train", "--cfg", "job", "-cn", "train", "--info", "defaults", "seed=1"], "train")
    with pytest.raises(ConfigError, match="ddp is not a setting: this command takes key=value, e.g. strategy=ddp"):
        check_flags(["seed=1", "ddp"], "train")


def test_hydras_mode_probe_is_skipped_only_where_its_answer_is_known(monkeypatch):
    """Hydra composes the whole config once only to read hydra.mode, before composing it to run: skipped (CI time,
    every process's start) where the answer is known, None, as each command's own config leaves it unset."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.hydra import Hydra

    from {{ cookiecutter.package_name }}.config import CONFIG_DIR
    from {{ cookiecutter.package_name }}.config.command_line import skip_the_hydra_mode_probe
    from {{ cookiecutter.package_name }}.config.objects import register_resolvers

    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR)):
        for command in ("train", "doctor", "bench"):
            assert compose(command, return_hydra_config=True).hydra.mode is None, command
    probe = Hydra.get_mode
    monkeypatch.setattr(Hydra, "get_mode", probe)
    for args in (["hydra.mode=MULTIRUN"], ["--config-dir", "runs/x", "--config-n", "best"], ["-cn", "best"]):
        skip_the_hydra_mode_probe(args)
        assert Hydra.get_mode is probe, args  # Hydra's own probe: the answer may be another
    skip_the_hydra_mode_probe(["seed=1", "--multirun"])
    assert Hydra.get_mode is not probe and Hydra.get_mode(None, "train", ["seed=1"]) is None


def test_the_command_lines_settings_are_checked_in_hydras_own_compose(monkeypatch, capsys):
    """A command line of plain `key=value` settings is checked on the config Hydra composes to run the command, before
    it applies them (CI time, every process's start: one compose instead of two); a refusal ends the command there,
    in one line, exit 2. Settings that add or remove keys, sweeps and another config are checked at once."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from {{ cookiecutter.package_name }}.config import CONFIG_DIR
    from {{ cookiecutter.package_name }}.config.objects import register_resolvers
    from {{ cookiecutter.package_name }}.config.overrides import check_overrides, checked_when_hydra_composes

    register_resolvers()
    apply, load = ConfigLoaderImpl._apply_overrides_to_config, ConfigLoaderImpl.load_configuration
    composes = []
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", lambda *a, **k: composes.append(1) or load(*a, **k))
    other_config = ["--config-dir", str(CONFIG_DIR), "seed=1"]
    for args in (["+trainer.foo=1"], ["~model.net.norm"], ["seed=1,2", "-m"], other_config):
        with contextlib.suppress(ConfigError):
            assert check_overrides(args, "train", defer=True) is None, args
        assert composes, f"{args}: checked at once, on a compose of its own"
        composes.clear()
    good = check_overrides(["model=gpt", "model.net.depth=1"], "train", defer=True)
    bad = check_overrides(["model=gpt", "model.net.depthz=1"], "train", defer=True)
    assert good and bad and not composes, "plain settings: no compose before Hydra's"
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR), job_name="train"):
        with checked_when_hydra_composes(good):
            assert compose("train", ["model=gpt", "model.net.depth=1"]).model.net.depth == 1
        assert len(composes) == 1 and ConfigLoaderImpl._apply_overrides_to_config is apply
        with pytest.raises(SystemExit) as refused, checked_when_hydra_composes(bad):
            compose("train", ["model=gpt", "model.net.depthz=1"])
    assert refused.value.code == 2 and ConfigLoaderImpl._apply_overrides_to_config is apply
    said = capsys.readouterr().err.strip()
    assert said.startswith("error: unknown setting model.net.depthz; did you mean model.net.depth?"), said


def test_a_refusal_every_srun_task_reaches_is_said_once_per_start(monkeypatch, tmp_path):
    """srun's tasks (launch/slurm.sbatch's tasks-per-node form) each reach the same refusal before they can talk to
    each other: the job's log had it once per task. The first task of the job step's start says it; a requeued job
    (the same job id) says it again."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(ERROR_FILE, raising=False)
    monkeypatch.setattr(errors, "started_by_slurm_step", lambda: True)  # (srun's tasks: slurmstepd's children)
    for name, value in {**SLURM_1x2, "SLURM_STEP_ID": "0", "SLURM_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    assert first_to_say("error: x"), "the first task"
    assert not first_to_say("error: x"), "the second task, the same words"
    assert first_to_say("error: y"), "other words: a refusal of that task only"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert first_to_say("error: x"), "requeued: a new start of the job"
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert first_to_say("error: x") and first_to_say("error: x"), "one task: nothing to share"
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setattr(errors, "started_by_slurm_step", lambda: False)  # typed in `srun -n 2 --pty bash`'s shell
    assert first_to_say("error: x") and first_to_say("error: x"), "each command typed there says its own"


def test_a_collective_broken_by_another_process_s_death_is_told_from_other_errors():
    """A process killed under torchrun: each survivor's collective fails with gloo's words, and each printed Hydra's
    40-line traceback before torchrun started them again (train.py now says it in one line)."""
    gloo = "[../pair.cc:553] Connection closed by peer [127.0.0.1]:9098. This is typically caused by a remote worker"
    try:
        try:
            raise RuntimeError(gloo)
        except RuntimeError as broken:
            raise ValueError("the step failed") from broken
    except ValueError as wrapped:
        assert lost_peer(wrapped) == "Connection closed by peer"
    assert (
        lost_peer(RuntimeError("Read error [127.0.0.1]:56004: Connection reset by peer.")) == "Connection reset by peer"
    )
    assert lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None


def test_a_time_limit_too_short_to_requeue_at_ends_the_job_instead_of_requeueing_it_for_ever(
    slurm, tmp_path, train_env
):
    """launch/slurm.sbatch under a --time shorter than its 90 s warning's margin: SLURM signals every start at once,
    which the script's requeue made a loop. The signal (sent here as soon as the script runs, as SLURM soon would)
    is said, and the job trains to its end, once."""
    script = Path(__file__).resolve().parents[1] / "launch/slurm.sbatch"
    submit = ["sbatch", "--parsable", "--time=2", "--nodes=1", "--ntasks-per-node=1", f"--chdir={tmp_path}"]
    training = [*QUICK, "trainer.max_steps=3", "logger=none"]
    done = subprocess.run([*submit, str(script), *training], env=train_env, capture_output=True, text=True, check=True)
    job = done.stdout.strip().split(";")[0]
    log = tmp_path / f"slurm-{job}.out"
    wait_for(lambda: log.exists() and log.stat().st_size > 0, job, log, "the script to run (its trap set)")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    wait_for(lambda: job_state(job) in ENDED, job, log, "the job to end")
    output = log.read_text()
    assert job_state(job) in ("COMPLETED", "GONE"), output[-4000:]
    assert f"time limit near: job {job} not requeued: --time=2:00 leaves under 90 s" in output, output[-4000:]
    assert "requeueing" not in output and "resuming from" not in output, "one start, not requeued"
