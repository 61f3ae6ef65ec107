"""python -m {{ cookiecutter.package_name }}.search: real searches of tiny trainings, read back from the study's journal,
the trials' run folders and their offline wandb files."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from conftest import PACKAGE
from engine_specific import DDP, QUIET, SEARCH_REFUSALS, SWEEP_COMMAND
from forked import run_module
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from optuna.distributions import IntDistribution
from optuna.trial import TrialState
from wandb_records import offline_runs

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.config.overrides import check_overrides
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.search import report
from {{ cookiecutter.package_name }}.search.__main__ import (
    baseline_values,
    changed_definition,
    compose_training,
    hold_lock,
    make_pruner,
    open_study,
    queue_grid_points,
    requeue_interrupted,
)
from {{ cookiecutter.package_name }}.search.__main__ import main as search_main
from {{ cookiecutter.package_name }}.search.report import (
    parallel_coordinate,
    summary_run_id,
    trial_table,
    write_best_config,
)
from {{ cookiecutter.package_name }}.search.settings import Settings, parse_command_line, parse_settings
from {{ cookiecutter.package_name }}.search.slurm import gpus_per_trial
from {{ cookiecutter.package_name }}.search.space import default_grid, load_space
from {{ cookiecutter.package_name }}.search.trials import (
    RUNNING,
    STOPPING,
    MetricMissing,
    TrialProcess,
    check_some_trial,
    run_trial,
    stop_all,
)
from {{ cookiecutter.package_name }}.tracking.epoch_metrics import append_epoch_metrics

PROJECT = Path(__file__).resolve().parents[1]  # searches run from the project root, as the README says
TINY = [
    "data.train_size=512",
    "trainer.max_epochs=2",
    "trainer.accelerator=cpu",
    *QUIET,
    "test_after_fit=false",
]
# Around the default lr (1e-3): on TINY trainings, 1.5e-3..2.5e-3 does better (measured: val/loss 0.98 at 2e-3,
# 1.16 at the default), so a search here must find at least the default's loss. (Wider nets at higher rates
# diverge: 1.88 at lr 4e-3, hidden 256.)
LR = {"model.optimizer.lr": {"type": "float", "low": 1.5e-3, "high": 2.5e-3, "log": True, "grid": [1.5e-3, 2.5e-3]}}


@dataclass
class Search:
    returncode: int
    output: str
    dir: Path

    @property
    def study(self) -> optuna.Study:
        backend = optuna.storages.journal.JournalFileBackend(str(self.dir / "journal.log"))
        return optuna.load_study(study_name=self.dir.name, storage=optuna.storages.JournalStorage(backend))

    def trials(self, *states: TrialState) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(states=states or None)

    def trial_dir(self, trial: optuna.trial.FrozenTrial) -> Path:
        return self.dir / "trials" / str(trial.user_attrs.get("continues", trial.number))


@pytest.fixture
def search(tmp_path, train_env):
    """search(*args, space=None, study="s", check=True, fork=True) -> Search: one search in tmp_path/<study>."""

    def run(
        *args: str,
        space: dict | None = None,
        study: str = "s",
        check: bool = True,
        background: bool = False,
        fork: bool = True,
    ):
        command = [sys.executable, "-m", f"{PACKAGE}.search", f"search.dir={tmp_path / study}", f"search.study={study}"]
        if space is not None:
            path = tmp_path / f"{study}-space.yaml"
            path.write_text(yaml.safe_dump(space))
            command.append(f"search={path}")
        command += args
        if background:
            output = subprocess.PIPE
            return subprocess.Popen(command, env=train_env, cwd=PROJECT, stdout=output, stderr=subprocess.STDOUT)
        if fork:  # CI time: the search and its trials (their guards, their trainings) forked, not new interpreters
            proc = run_module(command[2], command[3:], train_env, PROJECT, 900, preload=f"{PACKAGE}.train")
        else:
            proc = subprocess.run(command, env=train_env, cwd=PROJECT, capture_output=True, text=True, timeout=900)
        output = proc.stdout + proc.stderr
        if check:
            assert proc.returncode == 0, f"{' '.join(command)} failed:\n{output[-4000:]}"
        return Search(proc.returncode, output, tmp_path / study)

    return run


def epochs(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "epochs.jsonl").read_text().splitlines()]


def processes_running(folder: str) -> list[int]:
    """The processes whose command line names `folder` (a trial's run folder): its training and launcher."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if folder in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue  # ended meanwhile
    return pids


@pytest.fixture(scope="module")
def default_val_loss(tmp_path_factory, train_env) -> float:
    """val/loss of the training config as it is, after the same tiny training as every trial."""
    run_dir = tmp_path_factory.mktemp("default")
    args = [f"hydra.run.dir={run_dir}", "~logger", *TINY, f"epoch_metrics={run_dir / 'epochs.jsonl'}"]  # =none
    proc = run_module(f"{PACKAGE}.train", args, train_env, PROJECT, 300, preload=f"{PACKAGE}.train")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return epochs(run_dir)[-1]["val/loss"]


@pytest.mark.slow
@pytest.mark.engine_neutral
def test_random_then_tpe_find_a_config_at_least_as_good_as_the_default(search, default_val_loss):
    """TPE after one startup trial: trial 0 is drawn at random (TPE's startup sampler is Optuna's RandomSampler, the
    one search.sampler=random uses), trial 1 by TPE from trial 0's result. (search.sampler=random itself: the
    killed-search and pruning tests.)"""
    args = ["search.sampler=tpe", "search.startup_trials=1", "search.n_trials=2", "search.pruner=none", "logger=none"]
    result = search(*args, *TINY, space=LR)
    complete = result.trials(TrialState.COMPLETE)
    assert len(complete) == 2
    assert complete[0].value != complete[1].value, "every trial trains with its own parameters"
    for trial in complete:  # the parameters reached the training
        config = yaml.safe_load((result.trial_dir(trial) / "config.yaml").read_text())
        assert config["model"]["optimizer"]["lr"] == trial.params["model.optimizer.lr"]
        assert trial.value == epochs(result.trial_dir(trial))[-1]["val/loss"]
    assert result.study.best_value <= default_val_loss
    # the command that started it, checked: it continues (check_only=true was taken for another training override)
    checked = search(*args, *TINY, "check_only=true", space=LR)
    assert "check_only: the search passes its checks" in checked.output


@pytest.mark.slow
@pytest.mark.engine_neutral
def test_grid_enumerates_its_grid_two_trials_at_a_time_one_wandb_run_each(search, train_env):
    """search.baseline=true: the config as it is (a key the space adds with +: its class's default) is a trial beside
    the grid's points, each of which is still trained (it took one of their places; its +key crashed the search)."""
    dropout = {"type": "categorical", "choices": [0.0]}  # (not in the config: ResidualMLP's default)
    space = {**LR, "model.net.hidden": {"type": "categorical", "choices": [128]}, "+model.net.dropout": dropout}
    grid = ["search.sampler=grid", "search.baseline=true", "search.n_jobs=2", "search.pruner=none"]
    result = search(*grid, *TINY, space=space, study="grid")
    trials = result.trials()
    assert sorted((t.params["model.optimizer.lr"], t.params["model.net.hidden"]) for t in trials) == [
        (1e-3, 128),  # the baseline: the config's learning rate
        (1.5e-3, 128),
        (2.5e-3, 128),
    ]
    assert [t.user_attrs.get("baseline") for t in trials] == [True, None, None]
    assert all(trial.state == TrialState.COMPLETE for trial in trials)
    first, second, _ = sorted(trials, key=lambda t: t.datetime_start)
    assert second.datetime_start < first.datetime_complete, "the two trials ran at the same time"

    for trial in trials:  # one wandb run per trial, in the study's group, with the trial's parameters
        (run,) = offline_runs(result.trial_dir(trial))
        assert run.group == "grid" and run.exit_code == 0
        assert run.config["model"]["optimizer"]["lr"] == trial.params["model.optimizer.lr"]
        assert run.metric("val/loss")[-1] == pytest.approx(trial.value)
    (summary,) = offline_runs(result.dir)
    assert summary.group == "grid"
    assert summary.metric("best/value") == [pytest.approx(result.study.best_value)]
    assert (result.dir / "parallel_coordinate.png").stat().st_size > 0
    assert len((result.dir / "trials.csv").read_text().splitlines()) == 1 + len(trials)

    # best.yaml is a config the training accepts as it is
    rerun = ["--config-dir", str(result.dir), "--config-name", "best", "--cfg", "job"]
    printed = run_module(f"{PACKAGE}.train", rerun, train_env, PROJECT, 300, preload=f"{PACKAGE}.train")
    assert printed.returncode == 0, printed.stderr[-3000:]
    config = yaml.safe_load(printed.stdout)
    assert config["model"]["optimizer"]["lr"] == result.study.best_params["model.optimizer.lr"]
    assert config["data"]["train_size"] == 512 and config["experiment"] == "grid"


def test_a_study_started_anew_in_the_same_folder_gets_a_summary_run_of_its_own(tmp_path):
    def study_with_a_trial() -> optuna.Study:
        study = optuna.create_study()
        study.ask()
        return study

    first, again = study_with_a_trial(), study_with_a_trial()
    assert summary_run_id(first, tmp_path) == summary_run_id(first, tmp_path), "a study continued: its run, updated"
    assert summary_run_id(first, tmp_path) != summary_run_id(again, tmp_path), "a new study: a run of its own"


def test_best_yaml_keeps_a_recipe_the_search_added_with_a_plus(tmp_path, monkeypatch):
    """A search given +recipe=NAME (a preset folder of yours): best.yaml overrode /recipe, which train.yaml's defaults
    do not have, and its re-run was refused ("Could not override 'recipe'"), blaming the command line's last key."""
    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    (configs / "recipe").mkdir(exist_ok=True)
    (configs / "recipe" / "wide.yaml").write_text("# @package _global_\nmodel:\n  net:\n    hidden: 32\n")
    monkeypatch.setattr(report, "CONFIG_DIR", configs)
    study = optuna.create_study()
    study.add_trial(
        optuna.trial.create_trial(params={"seed": 3}, distributions={"seed": IntDistribution(1, 9)}, value=0.5)
    )
    overrides = ["+recipe=wide", "strategy=ddp"]
    write_best_config(configs / "best.yaml", study, overrides, {"recipe": "wide", "strategy": "ddp"}, ["train"])
    with initialize_config_dir(str(configs), version_base="1.3"):
        best = compose("best", return_hydra_config=True)
    assert (best.model.net.hidden, best.seed, best.hydra.runtime.choices.strategy) == (32, 3, "ddp")


@pytest.mark.slow
@pytest.mark.engine_neutral
def test_a_grid_point_the_training_refuses_is_not_queued_again(search):
    """A refusal is the point's (exit 2, before training): the grid went on queueing it until 3 had failed in a row."""
    space = {"model.net.depth": {"type": "categorical", "choices": [1, 0]}}  # (the search checks the first point)
    result = search("search.sampler=grid", "logger=none", *TINY, "trainer.max_epochs=1", space=space, study="refused")
    trials = result.trials()
    assert sorted((t.params["model.net.depth"], t.state) for t in trials) == [
        (0, TrialState.FAIL),
        (1, TrialState.COMPLETE),
    ], "each point once"
    (refused,) = result.trials(TrialState.FAIL)
    assert refused.user_attrs["refused"]
    said = f"trial {refused.number} failed (exit code 2: the training refused its parameters): error: model.net.depth=0"
    assert f"{said} must be a whole number >= 1; log: " in result.output


@pytest.mark.slow
@pytest.mark.engine_neutral
def test_a_grid_point_that_diverges_is_pruned_not_queued_again(search):
    """A NaN loss is the point's result: recorded as a failure, the grid queued it again until 3 had failed in a row
    and the search ended with exit 1 (and Lightning's progress bar hid the error line from the search's report)."""
    space = {"model.optimizer.lr": {"type": "categorical", "choices": [0.001, 1000.0]}}
    grid = ["search.sampler=grid", "search.n_trials=2", "logger=none", *TINY, "data.batch_size=32"]  # NaN by step 9
    result = search(*grid, space=space, study="diverged")
    states = sorted((t.params["model.optimizer.lr"], t.state) for t in result.trials())
    assert states == [(0.001, TrialState.COMPLETE), (1000.0, TrialState.PRUNED)], "each point once"
    assert "Traceback" not in result.output and "failed" not in result.output, result.output[-3000:]
    (diverged,) = result.trials(TrialState.PRUNED)
    log = Path(diverged.user_attrs["log"]).read_text()
    assert re.search(r"error: (train|val)/loss is nan .*\nsearch: trial \d+ diverged; recorded as pruned\n$", log)


@pytest.mark.slow
@pytest.mark.engine_neutral
def test_a_killed_search_continues_to_the_total_without_repeating_finished_trials(search, tmp_path):
    """SIGKILLed during its second trial: that trial's training dies with it (search/guard.py), and the search started
    again marks the trial failed, runs its parameters again and none of the finished ones."""
    args = ["search.sampler=random", "search.n_trials=2", "search.pruner=none", "logger=none", *TINY]
    first = search(*args, background=True)
    while not (tmp_path / "s" / "trials" / "1").exists():  # trial 0 finished, trial 1 started
        assert first.poll() is None, first.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    trial = str(tmp_path / "s" / "trials" / "1")
    while not processes_running(trial):
        time.sleep(0.1)
    first.kill()  # SIGKILL: the search cannot stop its trial itself
    first.wait(30)
    deadline = time.monotonic() + 30
    while (orphans := processes_running(trial)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not orphans, f"the killed search's trial trains on: {orphans}"
    saved = any((Path(trial) / "checkpoints").glob("*"))  # (killed before or after its first checkpoint)
    result = search(*args)
    again = r"trial 1 was interrupted: its parameters run again in a new trial, which (.*) in (.*)\n"
    said = re.search(again, result.output)
    assert said and said[2] == trial, result.output[-3000:]
    assert said[1] == ("continues from its last checkpoint" if saved else "starts over (it saved no checkpoint)")
    complete, failed = result.trials(TrialState.COMPLETE), result.trials(TrialState.FAIL)
    assert [trial.number for trial in failed] == [1]
    assert [trial.number for trial in complete] == [0, 2]
    assert complete[1].params == failed[0].params, "the interrupted trial's parameters run again"
    assert complete[1].user_attrs["log"] == f"{trial}/train.log", "in its folder, where its training continues"
    assert not (tmp_path / "s" / "trials" / "2").exists()
    assert len(epochs(result.trial_dir(complete[0]))) == 2, "a finished trial is not trained again"
    assert "1 of 2 trials finished" in result.output


@pytest.mark.slow
def test_ddp_trials_with_two_processes_and_a_huge_lr_pruned(search):
    ddp = DDP
    space = {"model.optimizer.lr": {"type": "float", "low": 30.0, "high": 100.0, "log": True}}
    settings = ["search.pruner=median", "search.n_trials=2", "search.baseline=true", "search.startup_trials=1"]
    # 24 epochs of ~0.1 s (several times that on a loaded CI machine): the search reads a trial's epochs every
    # 0.2 s, so a pruned trial stops within an epoch or two; with 8 epochs, a search process stalled by the load for
    # a second or two saw the pruned trial's first epoch only once it had run them all (a CI failure).
    epochs_to_run = 24
    args = [*settings, "search.sampler=random", *ddp, *TINY, f"trainer.max_epochs={epochs_to_run}"]
    # New interpreters, as a user's search: forked from the tests' zygote, both suites in CI saw the search read the
    # pruned trial's first epoch only once the trial had trained all 24 (never when run alone, even beside a CPU load).
    result = search(*args, space=space, study="ddp", fork=False)
    baseline, huge = result.trials()
    assert baseline.params["model.optimizer.lr"] == 1e-3 and baseline.state == TrialState.COMPLETE
    assert huge.state == TrialState.PRUNED and huge.params["model.optimizer.lr"] >= 30
    assert len(epochs(result.trial_dir(baseline))) == epochs_to_run
    assert len(epochs(result.trial_dir(huge))) < epochs_to_run / 2, "a pruned trial stops early"
    for trial in (baseline, huge):
        (run,) = offline_runs(result.trial_dir(trial))  # one wandb run per trial, not per process
        assert run.config["run"]["world_size"] == 2
        assert run.exit_code is not None, "the pruned trial's wandb run is closed"


@pytest.mark.slow
@pytest.mark.engine_neutral
def test_failing_trials_are_recorded_with_their_log_and_stop_the_search(search):
    space = {"model.net._target_": {"type": "categorical", "choices": ["own_models.CrashesInTraining"]}}
    result = search("search.max_failures=2", "search.n_trials=5", "logger=none", *TINY, space=space, check=False)
    assert result.returncode == 1, result.output[-3000:]
    failed = result.trials(TrialState.FAIL)
    assert len(failed) == 2
    logs = [Path(trial.user_attrs["log"]) for trial in failed]
    assert all("a bug in the forward" in log.read_text() for log in logs)
    assert f"error: search stopped: 2 trials in a row failed; the last one's log: {logs[-1]}" in result.output
    # one line per failed trial, with the training's error: no traceback of the search's own
    crash = "RuntimeError: a bug in the forward"
    for trial, log in zip(failed, logs, strict=True):
        (line,) = [line for line in result.output.splitlines() if line.startswith(f"trial {trial.number} failed")]
        assert crash in line and line.endswith(f"; log: {log}"), line
    assert "Traceback" not in result.output


@pytest.mark.slow
@pytest.mark.engine_neutral  # each engine's epoch reports: the pruning test
def test_a_metric_the_training_does_not_report_stops_the_search_at_the_first_epoch(search, tmp_path):
    args = ["search.metric=val/los", "search.n_trials=3", "logger=none", *TINY, "trainer.max_epochs=3"]
    result = search(*args, space=LR, check=False)
    assert result.returncode == 2, result.output[-3000:]
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    reported = "val/loss, val/acc, val/perplexity"
    assert errors == [f"error: search.metric=val/los is not reported; the first epoch reported {reported}"]
    assert "Traceback" not in result.output
    assert not result.dir.exists(), "a study that could not run a trial is not kept"


@pytest.mark.slow
@pytest.mark.engine_neutral
def test_trials_run_as_slurm_jobs(slurm, search):
    args = ["search.backend=slurm", "search.sampler=random", "search.n_trials=2", "search.n_jobs=2", *TINY]
    result = search(*args, space=LR, study="slurm", fork=False)  # trainings started by SLURM, as on a cluster
    jobs = {path.name for path in (result.dir / "slurm").iterdir() if path.is_dir()}  # one folder per job id
    assert len(jobs) == 2, "one SLURM job per trial"
    for trial in result.trials():
        assert trial.state == TrialState.COMPLETE
        config = yaml.safe_load((result.trial_dir(trial) / "config.yaml").read_text())
        assert str(config["run_id"]) in jobs, "the trial trained inside its SLURM job"
        (run,) = offline_runs(result.trial_dir(trial))
        assert run.group == "slurm" and run.exit_code == 0


@pytest.mark.parametrize(
    "listed, accelerator, devices, given, gpus",
    [
        ("gpu:4", "auto", 2, None, 2),  # a cluster with GPUs: the trial's devices
        ("(null)\ngpu:a100:8(S:0-1)", "gpu", None, None, 1),  # trainer.devices=auto: one
        ("(null)", "auto", 2, None, 0),  # no GPUs on the cluster: CPU trials
        ("gpu:4", "cpu", 2, None, 0),
        ("(null)", "cpu", 2, 3, 3),  # search.slurm_gpus_per_trial=3
        ("(null)", "gpu", 2, None, "refused"),
    ],
)
def test_slurm_trials_ask_for_their_devices_on_a_cluster_with_gpus(
    tmp_path, monkeypatch, listed, accelerator, devices, given, gpus
):
    sinfo = tmp_path / "sinfo"  # SLURM's sinfo --format=%G: the generic resources of each group of nodes
    sinfo.write_text(f"#!/bin/sh\nprintf '{listed}\\n'\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    settings = Settings(backend="slurm", slurm_gpus_per_trial=given)
    if gpus == "refused":
        with pytest.raises(ConfigError, match="trainer.accelerator=gpu, but SLURM lists no GPUs"):
            gpus_per_trial(settings, accelerator, devices)
    else:
        assert gpus_per_trial(settings, accelerator, devices) == gpus


class ScriptedTraining:
    """Stands in for a trial's training process (search.trials.Trial): one epoch of `losses` reported each time
    the search polls it, then exit code 0."""

    def __init__(self, losses: list[float], log: Path) -> None:
        self.losses, self.metrics_file, self.epoch = losses, log.parent / "epochs.jsonl", 0
        self.epochs = list(range(len(losses)))  # the epoch each validation writes

    def wait(self, seconds: float) -> int | None:
        if self.epoch == len(self.losses):
            return 0
        final = self.epoch + 1 == len(self.losses)
        append_epoch_metrics(self.metrics_file, self.epochs[self.epoch], {"val/loss": self.losses[self.epoch]}, final)
        self.epoch += 1
        return None

    def interrupt(self) -> None:
        pass

    def finish(self) -> None:
        pass


@pytest.mark.engine_neutral
def test_an_epoch_validated_twice_is_reported_once_and_the_trials_value_is_its_last(tmp_path):
    """Epoch 0 in the file from the start of the trial this one continues, validated again after its restart; epoch 1
    validated twice within the epoch (Lightning's val_check_interval): Optuna gets each epoch once, the trial the
    last validation's value."""
    folder = tmp_path / "trials" / "0"
    folder.mkdir(parents=True)
    append_epoch_metrics(folder / "epochs.jsonl", 0, {"val/loss": 0.9}, final=False)  # before the interruption
    study = optuna.create_study()

    def objective(trial: optuna.Trial) -> float:
        def start(command: list[str], env: dict[str, str], log: Path) -> ScriptedTraining:
            training = ScriptedTraining([0.8, 0.7, 0.6], log)
            training.epochs = [0, 1, 1]  # epoch 0 again, then two validations in epoch 1
            return training

        return run_trial(trial, start, [], {}, folder, "val/loss")

    study.optimize(objective, n_trials=1)
    assert study.trials[0].intermediate_values == {1: 0.9, 2: 0.7}
    assert study.trials[0].value == 0.6


@pytest.mark.engine_neutral
def test_a_grid_continued_after_a_kill_trains_each_point_once(tmp_path):
    """A grid search with a baseline (whose values are a point's), killed during a trial, continued (trials found
    running failed and queued again, the grid's missing points queued): every point trains once, the baseline too (it
    took the point's place, and a random point off the grid was trained instead). With Optuna's GridSampler a point
    trained twice and another never (its point numbers changed with its seed, which changes with the trial count),
    and a queued trial (the baseline, an interrupted one) stopped the search with KeyError 'grid_id'. A real Optuna
    journal, reopened as a restarted search does; the objective stands in for the trainings."""
    grid = {"lr": [0.01, 0.001, 0.003], "wd": [0.01, 1e-4]}
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log")))

    def objective(trial: optuna.Trial) -> float:
        return trial.suggest_float("lr", 1e-4, 1) + trial.suggest_float("wd", 1e-5, 1)

    def search(study: optuna.Study, total: int) -> None:  # the search's loop, with its seed
        while (left := total - len(study.get_trials(states=(TrialState.COMPLETE,)))) > 0:
            queue_grid_points(study, grid, 0, left)
            study.optimize(objective, n_trials=left)

    study = optuna.create_study(study_name="s", storage=storage)
    study.enqueue_trial({"lr": 0.01, "wd": 0.01}, user_attrs={"baseline": True})  # the config's: a point's values
    search(study, 3)  # the baseline and two points, then a third started, stopped before it drew its parameters:
    queue_grid_points(study, grid, 0, 1)
    study.ask()  # (the search killed now)

    restarted = optuna.load_study(study_name="s", storage=storage)
    restarted.sampler = optuna.samplers.RandomSampler(seed=len(restarted.trials))  # as the search seeds it
    requeue_interrupted(restarted, tmp_path, "val/loss")  # its run folder: no trace of a finished training
    search(restarted, 1 + 6)
    trained = [
        (trial.params["lr"], trial.params["wd"]) for trial in restarted.get_trials(states=(TrialState.COMPLETE,))
    ]
    assert sorted(trained) == sorted([(0.01, 0.01), *((lr, wd) for lr in grid["lr"] for wd in grid["wd"])])
    [interrupted] = restarted.get_trials(states=(TrialState.FAIL,))
    [again] = [trial for trial in restarted.trials if trial.user_attrs.get("continues") == interrupted.number]
    assert again.params == interrupted.system_attrs["fixed_params"] and again.state == TrialState.COMPLETE
    states = [row[1] for row in trial_table(restarted, [SimpleNamespace(key="lr"), SimpleNamespace(key="wd")])[1]]
    assert states[0] == "complete (baseline)"  # trials.csv says what each was
    assert states[interrupted.number] == f"interrupted, continued by trial {again.number}"


def test_a_stepped_range_is_its_own_grid_to_the_last_value():
    """0.0 to 0.3 by 0.1: its last value was 0.30000000000000004, refused as outside [0.0, 0.3]."""
    assert default_grid(optuna.distributions.FloatDistribution(0.0, 0.3, step=0.1)) == [0.0, 0.1, 0.2, 0.3]


@pytest.mark.engine_neutral
def test_a_continued_trial_found_running_is_read_from_its_folder(tmp_path):
    """A trial that continued an interrupted one trains in that one's folder: killed after its training finished, it
    is recorded from there (it was looked for in a folder of its own number, and trained a third time)."""
    study = optuna.create_study()
    study.enqueue_trial({"lr": 0.1}, user_attrs={"continues": 7})
    trial = study.ask()
    trial.suggest_float("lr", 1e-4, 1)
    folder = tmp_path / "trials" / "7"
    folder.mkdir(parents=True)
    append_epoch_metrics(folder / "epochs.jsonl", 0, {"val/loss": 0.6}, final=True)
    (folder / "finished").touch()
    requeue_interrupted(study, tmp_path / "trials", "val/loss")
    assert study.trials[trial.number].state == TrialState.COMPLETE and study.trials[trial.number].value == 0.6


@pytest.mark.engine_neutral
def test_a_trial_whose_training_finished_before_the_kill_is_recorded_not_run_again(tmp_path):
    """Killed in the instant after a trial's training finished, before the search recorded it: on restart the trial
    gets its value from its run folder (the training's `finished` marker and its epochs' metrics); a trial killed
    while training is failed and queued again. A real Optuna journal, reopened as a restarted search does."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log")))
    study = optuna.create_study(study_name="s", storage=storage)
    done, training = study.ask(), study.ask()
    for trial in (done, training):
        trial.suggest_float("lr", 1e-4, 1)
    done_dir, training_dir = tmp_path / "trials" / str(done.number), tmp_path / "trials" / str(training.number)
    for run_dir, epochs in ((done_dir, [0.9, 0.7]), (training_dir, [0.8])):
        run_dir.mkdir(parents=True)
        for epoch, loss in enumerate(epochs):
            append_epoch_metrics(run_dir / "epochs.jsonl", epoch, {"val/loss": loss}, final=epoch == 1)
    (done_dir / "finished").touch()  # written by the training at its normal end

    restarted = optuna.load_study(study_name="s", storage=storage)
    requeue_interrupted(restarted, tmp_path / "trials", "val/loss")
    recorded, failed = restarted.trials[done.number], restarted.trials[training.number]
    assert recorded.state == TrialState.COMPLETE and recorded.value == 0.7
    assert failed.state == TrialState.FAIL
    queued = restarted.get_trials(states=(TrialState.WAITING,))
    assert [trial.system_attrs["fixed_params"] for trial in queued] == [failed.params], "only the interrupted one"


@pytest.mark.engine_neutral
def test_the_plot_shows_every_trial_and_names_every_axis_in_full():
    """parallel_coordinate.png: every trial's line stands out from the white background (Optuna's colours drew the
    worst almost white), and the axes carry the parameters' full names, side by side (Optuna cut long ones)."""
    study = optuna.create_study()
    for lr, weight_decay in [(1e-4, 1e-5), (3e-4, 1e-4), (1e-3, 1e-3), (3e-3, 1e-2), (1e-2, 1e-1)]:
        study.enqueue_trial({"model.optimizer.lr": lr, "model.optimizer.weight_decay": weight_decay})
    study.optimize(
        lambda trial: (
            trial.suggest_float("model.optimizer.lr", 1e-4, 1e-2, log=True) * 100
            + trial.suggest_float("model.optimizer.weight_decay", 1e-5, 1e-1, log=True)
        ),
        n_trials=5,
    )
    figure = parallel_coordinate(study, "val/loss")
    figure.canvas.draw()
    [lines] = [c for c in figure.axes[0].collections if c.get_array() is not None]
    assert len(lines.get_edgecolor()) == 5
    for red, green, blue, _ in lines.get_edgecolor():
        assert 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.8, "a line almost as light as the background"
    labels = figure.axes[0].get_xticklabels()
    assert [label.get_text() for label in labels] == [
        "val/loss",
        "model.optimizer\nlr",
        "model.optimizer\nweight_decay",
    ]
    boxes = [label.get_window_extent() for label in labels]
    assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:], strict=False)), "labels overlap"


@pytest.mark.parametrize("pruner, pruned", [("none", False), ("median", True), ("hyperband", True)])
def test_pruners_stop_a_trial_far_worse_than_the_ones_before(tmp_path, pruner, pruned):
    """The search's pruners (search.pruner=...) on its trial loop, with scripted epochs instead of trainings."""
    epochs, trials = 4, 4
    # Hyperband puts each trial in a bracket by a hash of the study's name and the trial's number: with these,
    # the bad trial shares the first bracket (a rung after 1 epoch) with the good ones.
    study = optuna.create_study(study_name="pruning")
    settings = Settings(pruner=pruner, startup_trials=2)  # median: compares from the third trial on
    study.pruner = make_pruner(settings, OmegaConf.create({"trainer": {"max_epochs": epochs}}))

    def objective(trial: optuna.Trial) -> float:
        bad = trial.number == trials - 1
        losses = [100.0] * epochs if bad else [1 / (epoch + 1) - 0.01 * trial.number for epoch in range(epochs)]

        def start(command: list[str], env: dict[str, str], log: Path) -> ScriptedTraining:
            return ScriptedTraining(losses, log)

        return run_trial(trial, start, [], {}, tmp_path / str(trial.number), "val/loss")

    study.optimize(objective, n_trials=trials)
    *good, bad = study.trials
    assert all(trial.state == TrialState.COMPLETE and len(trial.intermediate_values) == epochs for trial in good)
    if pruned:
        assert bad.state == TrialState.PRUNED and len(bad.intermediate_values) == 1, "pruned after its first epoch"
    else:
        assert bad.state == TrialState.COMPLETE and bad.value == 100.0


@pytest.mark.parametrize("pruner", ["median", "hyperband"])
def test_a_trial_worse_only_at_its_final_epoch_completes(tmp_path, pruner):
    """Its training is done by then: pruned there, the trial would be recorded without its value, all its epochs
    trained for nothing."""
    epochs = 3
    study = optuna.create_study(study_name="pruning")
    study.pruner = make_pruner(
        Settings(pruner=pruner, startup_trials=2), OmegaConf.create({"trainer": {"max_epochs": epochs}})
    )

    def objective(trial: optuna.Trial) -> float:
        losses = [1 / (epoch + 1) for epoch in range(epochs)]
        if trial.number == 3:
            losses[-1] = 100.0

        def start(command: list[str], env: dict[str, str], log: Path) -> ScriptedTraining:
            return ScriptedTraining(losses, log)

        return run_trial(trial, start, [], {}, tmp_path / str(trial.number), "val/loss")

    study.optimize(objective, n_trials=4)
    assert [trial.state for trial in study.trials] == [TrialState.COMPLETE] * 4
    assert study.trials[-1].value == 100.0


@pytest.fixture
def search_command(tmp_path, monkeypatch, capsys):
    """The search's command line run in this process (no training starts): (exit code, stdout + stderr)."""
    monkeypatch.chdir(PROJECT)

    def run(*args: str, space: dict | str | None = None) -> tuple[int, str]:
        if space is not None:
            (tmp_path / "space.yaml").write_text(space if isinstance(space, str) else yaml.safe_dump(space))
            args = (f"search={tmp_path / 'space.yaml'}", *args)
        monkeypatch.setattr(sys, "argv", ["search", f"search.dir={tmp_path / 's'}", "search.study=s", *args])
        try:
            search_main()
            code = 0
        except SystemExit as exit:
            code = exit.code
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


def test_the_search_puts_the_signal_handlers_back_when_it_returns(monkeypatch):
    """From a notebook: a later Ctrl-C there ran a finished search's handler (stop its trials, write its table)."""
    import signal

    from {{ cookiecutter.package_name }}.search import __main__ as command

    def a_search_that_handles_signals() -> None:  # (what the search does once its study is open)
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: None)
        raise SystemExit(1)

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(command, "search", a_search_that_handles_signals)
    with pytest.raises(SystemExit):
        command.main()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


DROPOUT = {"type": "float", "low": 0.0, "high": 0.5}  # a setting the space adds to the net (+model.net.dropout)


@pytest.mark.engine_neutral
def test_the_baseline_starts_from_the_config_as_it_is_or_refuses_in_one_line(tmp_path):
    """Its value for a +key is the class's default (it was None, and Optuna's traceback stopped the search after its
    first trials); a value a categorical does not have, or a key of no default, is refused before the first trial."""
    cfg, groups = compose_training([])

    def baseline(space: dict) -> dict:
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
        return baseline_values(load_space(tmp_path / "space.yaml", cfg, groups), cfg)

    depth = {"type": "int", "low": 1, "high": 3}  # the config's 4 lies outside: the baseline is what it is
    assert baseline({"+model.net.dropout": {"type": "float", "low": 0.0, "high": 0.3}, "model.net.depth": depth}) == {
        "+model.net.dropout": 0.0,
        "model.net.depth": 4,
    }
    assert baseline({"strategy": {"type": "categorical", "choices": ["single", "ddp"]}}) == {"strategy": "single"}
    with pytest.raises(ConfigError, match=r"model.net.hidden is 128 in the training config, not one of the space's"):
        baseline({"model.net.hidden": {"type": "categorical", "choices": [64, 256]}})
    with pytest.raises(ConfigError, match=r"\+model.net.colour has no value to start from"):
        baseline({"+model.net.colour": {"type": "float", "low": 0.0, "high": 1.0}})


@pytest.mark.engine_neutral
def test_a_study_continued_with_search_baseline_gets_its_baseline_trial_once(tmp_path):
    """A study started without a baseline and continued with search.baseline=true took it without a word."""
    cfg, groups = compose_training([])
    lr = {"model.optimizer.lr": {"type": "float", "low": 0.1, "high": 1}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(lr))
    params = load_space(tmp_path / "space.yaml", cfg, groups)
    settings = parse_settings([f"search.dir={tmp_path / 's'}", "search.study=s"])
    settings.study_dir.mkdir()
    open_study(settings, params, [], cfg, None)
    for _ in range(2):  # (continued again: still one)
        study = open_study(settings, params, [], cfg, baseline_values(params, cfg))
    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [trial.user_attrs for trial in queued] == [{"baseline": True}]
    assert queued[0].system_attrs["fixed_params"] == {"model.optimizer.lr": 1e-3}  # the config's


@pytest.mark.engine_neutral
def test_the_best_configs_command_line_is_checked_as_the_trainings_is(tmp_path):
    """`train --config-dir <study> --config-name best trainer.max_epoch=3`: Hydra's five lines and exit code 1; now the
    training's one line, against best.yaml's config (which composes `train`)."""
    (tmp_path / "best.yaml").write_text("defaults:\n- train\n- _self_\nexperiment: grid\n")
    check_overrides(["--config-dir", str(tmp_path), "--config-name", "best", "trainer.max_epochs=3"], "train")
    with pytest.raises(ConfigError, match="unknown setting trainer.max_epoch; did you mean trainer.max_epochs"):
        check_overrides([f"--config-dir={tmp_path}", "--config-name=best", "trainer.max_epoch=3"], "train")


@pytest.mark.engine_neutral
def test_a_study_is_continued_with_its_overrides_in_any_order_and_told_what_changed():
    started = {"overrides": ["trainer.max_epochs=2", "data.train_size=1024"], "metric": "val/loss", "space": {"a": "x"}}
    assert changed_definition(started, {**started, "overrides": ["data.train_size=1024", "trainer.max_epochs=2"]}) == ""
    assert (
        changed_definition(started, {**started, "metric": "val/los"}) == "another search.metric (val/loss, now val/los)"
    )
    assert changed_definition(started, {**started, "space": {"a": "y"}}) == (
        "another search space: a was x, now y (the space file changed)"
    )


@pytest.mark.engine_neutral
def test_a_search_setting_with_a_plus_or_tilde_is_the_searchs_to_refuse():
    """`+search.n_trials=3` went to the training's check as a training key: "no part of the training reads a top-level
    search" (a user adding the +, as Hydra asks for a key that is not there, was told the search has no settings)."""
    settings, overrides, _ = parse_command_line(["search.n_trials=3", "seed=1"])
    assert settings.n_trials == 3 and overrides == ["seed=1"]
    for arg, message in [
        ("+search.n_trials=3", "+search.n_trials: the search has every setting already, to be set without + or ~: "
         "search.n_trials=..."),
        ("~search", "~search: the search has every setting already, to be set without + or ~: search=..."),
        ("+search.n_trails=3", "unknown setting +search.n_trails; valid: search=<space>, search.space"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_command_line([arg, "seed=1"])


REFUSED_BATCH = "the training refuses the first trial's config: data.batch_size=64 is the global batch and must be"


def test_a_value_only_some_trials_get_fails_those_trials_alone(monkeypatch, capsys):
    """The first trial's config (each parameter at its first value) refused by the training stopped the whole search,
    although the other values were fine (3 attention heads over 2 tensor-parallel ranks, choices [3, 2]; [2, 3]
    searched). The configs with another value of a parameter are checked too: only where all are refused, it stops."""
    monkeypatch.chdir(PROJECT)
    over_3 = ["strategy=ddp", "trainer.devices=3", "trainer.accelerator=cpu"]
    trial = lambda batch: compose_training([*over_3, f"data.batch_size={batch}"])[0]  # noqa: E731
    check_some_trial(trial(64), iter([trial(128), trial(96)]), "ddp", 3, {})  # 96 splits over 3 processes
    assert (
        "note: the training refuses some trials' configs (data.batch_size=64 is the global batch"
        in capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match=REFUSED_BATCH):
        check_some_trial(trial(64), iter([trial(128)]), "ddp", 3, {})


def test_a_trial_that_never_validates_stops_the_search(tmp_path):
    """A training that never validates (trainer.limit_val_batches=0) reports nothing:
    every trial would, and the search went on until 3 in a row had failed."""
    start = lambda command, env, log: TrialProcess(command, env, log)  # noqa: E731
    with pytest.raises(MetricMissing, match="trial 0 trained to its end without a validation, so without val/loss"):
        run_trial(optuna.create_study().ask(), start, [sys.executable, "-c", "pass"], {}, tmp_path, "val/loss")


def test_a_second_search_of_a_study_is_refused_while_the_first_holds_it(tmp_path):
    """One search per study: its lock is held by the search, its trials and their guards (which stop a killed
    search's trials within their grace period), and a second search is told so in one line."""
    first = hold_lock(tmp_path)
    with pytest.raises(ConfigError, match=r"another search is running study .*, or a trial of a killed one is still "
                       r"stopping \(its guard ends it within about 10 s"):  # fmt: skip
        hold_lock(tmp_path)
    first.close()
    hold_lock(tmp_path).close()  # free again once the holder is gone


@pytest.mark.parametrize(
    "space, args, message",
    [
        ({"model.optimizer.lrr": {"type": "float", "low": 0.1, "high": 1}}, [], "valid under model.optimizer: lr,"),
        ({"model.optimizer.lr": {"type": "float", "low": 0.0, "high": 1, "log": True}}, [], "model.optimizer.lr: "),
        ({"model.optimizer.lr": {"type": "normal", "low": 0.1}}, [], "type: float, int, categorical"),
        ({"strategy": {"type": "categorical", "choices": ["ddpp"]}}, [], "unknown strategy ddpp; valid: ddp,"),
        ({"model.optimizer.lr": {"type": "float", "low": 0.1, "high": 1}}, ["search.sampler=grid"], "`grid: [...]`"),
        (None, ["search.sampler=bayes"], "search.sampler='bayes' is unknown; valid: grid, random, tpe"),
        (None, ["search.n_trails=3"], "unknown setting search.n_trails; valid: search=<space>, search.space"),
        # Optuna's ValueError after the study was written (the corrected command then met the written study)
        (None, ["search.seed=-1"], "search.seed must be a whole number from 0 to 4294967295, not -1"),
        (None, ["search.startup_trials=-1"], "search.startup_trials must be at least 0, not -1"),
        (None, ["search.sampler={a"], "search.sampler={a is not a value: close its quotes and brackets"),  # (yaml's)
        (None, ["search.study=a/b"], "search.study=a/b must name one folder"),  # (each trial refused it, then)
        (None, ["search.dir=/proc/x"], "search.dir=/proc/x cannot be made (No such file or directory)"),
        (None, ["search=nope"], "unknown search space 'nope'; valid: default, gpt, or a path to a .yaml file"),
        (None, ["search=/nope/space.yaml"], "search=/nope/space.yaml: there is no such file"),
        (  # (a categorical's value must be one of its choices: Optuna's traceback after the first trials)
            {"model.net.hidden": {"type": "categorical", "choices": [64, 256]}},
            ["search.baseline=true"],
            "search.baseline=true: model.net.hidden is 128 in the training config, not one of the space's choices",
        ),
        (None, ["strategy=ddpp"], "unknown strategy 'ddpp'; valid: ddp,"),
        (None, ["--experiment=x"], "--experiment is not an option of this command: its settings are key=value, e.g. e"),
        (None, ["--n_trials", "3"], "--n_trials is not an option of this command: its settings are key=value, e.g. s"),
        (None, ["trainer.max_epoch=1"], "unknown setting trainer.max_epoch; did you mean trainer.max_epochs?"),
        ("model.optimizer.lr: {type: float, low: 1.0e-4\n", [], "is not valid YAML, line 2 column 1: expected ','"),
        # the training's own checks, on the first trial's config: 64 samples do not split over 3 processes
        (None, ["strategy=ddp", "trainer.devices=3", "trainer.accelerator=cpu", "data.batch_size=64"], REFUSED_BATCH),
        # a key of your own model's, added by the space (+): it composes, the same check refuses the first trial
        (
            {"+model.net.dropout": {"type": "float", "low": 0.0, "high": 0.5}},
            ["strategy=ddp", "trainer.devices=3", "trainer.accelerator=cpu", "data.batch_size=64"],
            REFUSED_BATCH,
        ),
        ({"+model.optimizer.lr": {"type": "float", "low": 0.1, "high": 1}}, [], "model.optimizer.lr"),
        (
            {"model.net.dropout": {"type": "float", "low": 0.0, "high": 0.5}},
            [],
            "an argument of your own model: +model",
        ),
        ({"data.batch_size": {"type": "float", "low": 16, "high": 64}}, [], "a whole number (256 now): give type: int"),
        # (every trial refused it, after the study was written)
        (
            {"model.optimizer": {"type": "categorical", "choices": [1, 2]}},
            [],
            "model.optimizer in the search space is a ",
        ),
        ({"model.net.depth": {"type": "int", "low": 1.5, "high": 4}}, [], "low: 1.5 is not a whole number (type: int;"),
        ({"model.optimizer.lr": {"type": "categorical", "choices": 0.001}}, [], "choices: 0.001: give a non-empty"),
        # every trial given it failed, and the search went on (the first trial's, at 64, passed the checks)
        ({"model.net.hidden": {"type": "categorical", "choices": [64, "abc"]}}, [], "the choice abc is not a"),
        # a quoted "no" was a log scale; a step of 0 a step of 1; a grid of one number Python's "not iterable"
        ({"model.optimizer.lr": {"type": "float", "low": 0.1, "high": 1, "log": "no"}}, [], "log: 'no' must be true"),
        ({"model.net.hidden": {"type": "int", "low": 16, "high": 32, "step": 0}}, [], "step: 0 must be a number > 0"),
        ({"model.optimizer.lr": {"type": "float", "low": 0.001, "high": 1, "grid": 0.01}}, [], "give a list of values"),
        *SEARCH_REFUSALS,
    ],
)
def test_bad_input_is_refused_before_the_first_trial(search_command, tmp_path, space, args, message):
    code, output = search_command(*args, space=space)
    assert code == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], output[-3000:]
    assert "Traceback" not in output
    assert not (tmp_path / "s").exists()


def test_slurm_without_a_controller_is_refused_before_the_first_trial(search_command, tmp_path, monkeypatch):
    """sbatch installed, its controller down: submitit's traceback at the first trial, the study written with that
    trial left "running"."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "sbatch").write_text("#!/bin/sh\nexit 1\n")
    (tools / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    code, output = search_command("search.backend=slurm", "trainer.accelerator=cpu")
    assert code == 2 and "search.backend=slurm: SLURM does not answer here (sinfo: error: Unable to contact" in output
    assert "Traceback" not in output and not (tmp_path / "s").exists()


def test_check_only_checks_the_search_and_starts_no_trial(search_command, tmp_path):
    """check_only=true reached every trial, which trained nothing, and the search stopped on "trained to its end
    without a validation"."""
    code, output = search_command("check_only=true", "trainer.accelerator=cpu")
    assert code == 0 and "check_only: the search passes its checks" in output, output[-3000:]
    assert not (tmp_path / "s").exists(), "no study, no trial"
    code, output = search_command("check_only=true", "search.seed=-1")  # its checks: still refused
    assert code == 2 and "search.seed must be" in output
    # a study to continue, on other terms: refused as the search itself refuses it (check_only passed it)
    (tmp_path / "s").mkdir()
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "s" / "journal.log"))
    )
    optuna.create_study(study_name="s", storage=storage, direction="minimize")
    code, output = search_command("check_only=true", "search.direction=maximize", "search.metric=val/acc")
    assert code == 2 and "was started to minimize val/acc; continue it with search.direction=minimize" in output
    assert len(optuna.load_study(study_name="s", storage=storage).user_attrs) == 0, "nothing written"


def test_a_study_continued_in_another_direction_or_folder_is_refused(search_command, tmp_path):
    """search.direction=maximize on a study started to minimize: Optuna took it again without a word, and the study
    went on minimizing (its best the lowest accuracy). A study in the folder of another (search.dir): its trials
    continued the other's checkpoints and reported their results for other parameters."""
    (tmp_path / "s").mkdir()
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "s" / "journal.log"))
    )
    optuna.create_study(study_name="s", storage=storage, direction="minimize")
    code, output = search_command("search.direction=maximize", "search.metric=val/acc")
    assert code == 2 and "error: study s in" in output and "was started to minimize val/acc; continue it with " \
        "search.direction=minimize, or start a new one with search.study=<name>" in output, output[-3000:]  # fmt: skip
    code, output = search_command("search.study=other")
    assert code == 2 and f"error: search.dir={tmp_path / 's'} holds study s: give each study its own folder" in output
    assert optuna.get_all_study_names(storage) == ["s"], "nothing of the refused study is written"


@pytest.mark.engine_neutral  # the search's threads and a process of its own: no training
def test_a_trial_stopped_with_the_search_stays_running_in_the_study(tmp_path):
    """Ctrl-C under search.n_jobs=2: the trials' threads recorded the stopped trials as failed ("exit code 254: no
    error line") before the search ended, and the next search drew new parameters instead of running theirs again.
    A trial's thread now records nothing once the search stops."""
    study = optuna.create_study()
    trial = study.ask()
    start = lambda command, env, log: TrialProcess(command, env, log)  # noqa: E731
    started = tmp_path / "started"  # the trial's own process runs (the guard has its handlers by then)
    sleeper = [sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(30)"]
    ended = threading.Event()

    def run() -> None:
        try:
            run_trial(trial, start, sleeper, {}, tmp_path / "trial", "val/loss")
        finally:
            ended.set()

    threading.Thread(target=run, daemon=True).start()  # (left blocked: the search ends the process)
    deadline = time.monotonic() + 30
    while not started.exists() and not ended.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert RUNNING and started.exists(), "the trial did not start"
    time.sleep(0.2)
    try:
        STOPPING.set()
        stop_all()  # what the search's Ctrl-C handler does, before it ends the process
        assert not ended.wait(3), "the stopped trial's thread went on to record it (Optuna: failed)"
    finally:
        STOPPING.clear()


def test_help_prints_the_usage(search_command, tmp_path):
    code, output = search_command("--help")  # was `error: training overrides --help: LexerNoViableAltException`
    assert code == 0 and output.startswith("usage: python -m") and "docs/search.md" in output, output[-3000:]
    assert not (tmp_path / "s").exists()


def test_export_wandb_sweep(search_command, tmp_path):
    sweep_file = tmp_path / "sweep.yaml"
    ddp = ["strategy=ddp", "trainer.devices=2"]
    code, _ = search_command("search.sampler=tpe", *ddp, "--export-wandb-sweep", str(sweep_file))
    assert code == 0 and not (tmp_path / "s").exists(), "exporting runs no trial"
    sweep = yaml.safe_load(sweep_file.read_text())
    assert sweep["method"] == "bayes" and sweep["metric"] == {"name": "val/loss", "goal": "minimize"}
    assert sweep["parameters"]["model.optimizer.lr"] == {"distribution": "log_uniform_values", "min": 1e-4, "max": 0.1}
    assert sweep["parameters"]["model.net.hidden"] == {"values": [64, 128, 256]}
    assert sweep["early_terminate"]["type"] == "hyperband"
    launcher = [*SWEEP_COMMAND, f"{PACKAGE}.train"]
    assert sweep["command"] == [*launcher, "experiment=s", "strategy=ddp", "trainer.devices=2", "${args_no_hyphens}"]
    code, output = search_command("--export-wandb-sweep", str(tmp_path / "no-such-folder" / "sweep.yaml"))
    assert code == 2 and "there is no folder" in output and "Traceback" not in output, output[-2000:]
    code, output = search_command("--export-wandb-sweep", "search.n_trials=3")  # (a file of that name, exit 0)
    assert code == 2 and "--export-wandb-sweep needs a file name" in output
    code, output = search_command("--export-wandb-sweep", str(tmp_path))  # (IsADirectoryError's traceback)
    assert code == 2 and f"{tmp_path} is a folder: give a file name" in output and "Traceback" not in output


def test_the_language_models_space_fits_it_and_only_it(search_command, tmp_path):
    sweep_file = tmp_path / "sweep.yaml"
    code, output = search_command("search=gpt", "model=gpt", "--export-wandb-sweep", str(sweep_file))
    assert code == 0, output[-3000:]
    assert yaml.safe_load(sweep_file.read_text())["parameters"]["model.net.dim"] == {"values": [32, 64, 128]}
    code, output = search_command("search=default", "model=gpt")  # names model.net.hidden, which GPT has not
    assert code == 2 and "model.net.hidden" in output and "Traceback" not in output, output[-3000:]


def test_exported_wandb_sweep_passes_wandbs_own_schema(search_command, tmp_path, train_env):
    # wandb checks a sweep against the JSON schema of its `sweeps` package (wandb[sweeps]), which pins numpy<2 and
    # needs scikit-learn and scipy: not dependencies of this project. Checked in a process of its own, which also
    # sees SWEEPS_SITE (a folder with sweeps and its scientific stack, kept out of the trainings' environment:
    # with scipy installed, importing Lightning imports scipy.signal, ~0.5 s more for every training process).
    path = [train_env["PYTHONPATH"], os.environ.get("SWEEPS_SITE")]
    env = dict(train_env, PYTHONPATH=os.pathsep.join(entry for entry in path if entry))
    # every file in that one process (each process imports scikit-learn and scipy: CI time)
    check = (
        "import sys, sweeps, yaml\n"
        "for path in sys.argv[1:]:\n"
        "    print(sweeps.schema_violations_from_proposed_config(yaml.safe_load(open(path))))"
    )
    # and a key the space adds (+): wandb's parameter names take no +, the command adds it before the agent sets it
    added = {"model.optimizer.lr": {"type": "float", "low": 1e-4, "high": 0.1}, "+model.net.dropout": DROPOUT}
    sweep_files = []
    for sampler, space in (("grid", None), ("random", None), ("tpe", None), ("random", added)):
        sweep_files.append(sweep_file := tmp_path / f"{sampler}-{len(sweep_files)}.yaml")
        assert search_command(f"search.sampler={sampler}", "--export-wandb-sweep", str(sweep_file), space=space)[0] == 0
        if space:
            assert yaml.safe_load(sweep_file.read_text())["command"][-2:] == [
                "+model.net.dropout=0.0",
                "${args_no_hyphens}",
            ]
    command = [sys.executable, "-c", check, *map(str, sweep_files)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if "No module named" in result.stderr:
        pytest.skip(f"wandb's sweep schema is in `sweeps` (wandb[sweeps]): {result.stderr.splitlines()[-1]}")
    violations = result.stdout.splitlines()
    assert result.returncode == 0 and violations == ["[]"] * len(sweep_files), result.stdout + result.stderr[-2000:]
