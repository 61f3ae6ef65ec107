"""Search hyperparameters with Optuna; every trial is a full training. Run from the project root:

    python -m {{ cookiecutter.package_name }}.search search=default search.n_trials=20 search.sampler=tpe search.pruner=median \
        search.n_jobs=2 search.study=lr-width [training overrides, e.g. strategy=ddp trainer.devices=2]

settings -> training config (composed once, to check every key) -> space -> study (resumed if it exists) ->
trials until search.n_trials have finished -> summary: best.yaml, trials.csv, a plot, a wandb summary run.
Everything lands in outputs/search/<study>/; trial n trains in trials/<n>/ (its config, log, wandb run).
"""

import fcntl
import inspect
import itertools
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from optuna.trial import TrialState

from ..config import CONFIG_DIR
from ..config.groups import check_group_choices, without_logger
from ..config.objects import register_resolvers
from ..config.overrides import check_overrides
from ..engine.launching import processes_per_trial, slurm_tasks, trial_command
from ..errors import ConfigError, fail
from ..parallel.launcher import free_port
from ..parallel.presets import built_in_preset
from ..runtime.checkpoint_files import saved_checkpoint
from ..runtime.interrupt import FINISHED_FILE
from ..tracking.epoch_metrics import read_epoch_metrics
from .guard import GRACE_SECONDS
from .report import summarize, write_results
from .settings import Settings, parse_command_line
from .slurm import SlurmTrial, gpus_per_trial, slurm_executor
from .space import Param, grid_space, hydra_value, load_space, space_path
from .trials import (
    STOPPING,
    DeviceSlots,
    MetricMissing,
    StartTrial,
    TrialFailed,
    TrialProcess,
    check_some_trial,
    local_devices,
    run_trial,
    stop_all,
)
from .wandb_sweep import write_wandb_sweep

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def usage() -> str:
    """`--help`: what the command takes, in a few lines (all of it: docs/search.md)."""
    names = ", ".join(f"search.{field.name}" for field in fields(Settings) if field.name != "space")
    return (
        f"usage: python -m {__package__} [search=<space>] [search.<setting>=<value> ...] [--export-wandb-sweep FILE]"
        " [training overrides]\n\n"
        "Searches a space of training settings with Optuna (search=default: configs/search/default.yaml), one\n"
        "training per trial, in outputs/search/<study>/; training overrides (strategy=ddp trainer.devices=2 ...)\n"
        "apply to every trial. --export-wandb-sweep FILE writes the search as a wandb sweep instead of running it.\n"
        f"Settings: {names}.\nAll of it: docs/search.md"
    )


def main() -> None:
    """The search command. Its Ctrl-C and SIGTERM handlers (stop the trials, write the table) are put back as they
    were when it returns: called from a notebook, they outlived it, and a later Ctrl-C there ran a stopped search's."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        search()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def search() -> None:
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(usage())
        return
    try:
        settings, overrides, sweep_file = parse_command_line(sys.argv[1:])
        overrides = without_logger(overrides)  # ~logger: no logger, as logger=none
        check_group_choices(overrides)  # as the training command checks its command line: what is valid, the
        check_overrides(overrides, "train")  # nearest key to a typo, a value of the wrong type
        cfg, groups = compose_training(overrides)
        params = load_space(space_path(settings.space), cfg, groups)
        baseline = baseline_values(params, cfg) if settings.baseline else None
        first_trial = check_trial_config(params, overrides)
        grid = grid_space(params) if settings.sampler == "grid" else None
        preset = built_in_preset(groups["strategy"], cfg.strategy)  # a preset file of yours: the built-in one it is
        processes = processes_per_trial(cfg.trainer.devices, preset) or 1
        trial_command(preset, processes)  # refuses a launched preset without its launcher config
        if sweep_file:
            write_wandb_sweep(Path(sweep_file), settings, params, overrides, preset, processes)
            print(f"wandb sweep written to {sweep_file}; run it: wandb sweep {sweep_file}, then wandb agent <id>")
            return
        slots, start = trial_starter(settings, cfg, preset)
        if settings.backend == "local":  # (a SLURM trial runs on a node whose devices the search does not see)
            others = other_trial_configs(params, overrides)
            check_some_trial(first_trial, others, preset, processes, slots.first)
        if cfg.check_only:  # (passed on to the trials, it trained none of them: "trained to its end without a
            # validation")
            if (settings.study_dir / "journal.log").exists():  # a study to continue: on the same terms
                check_stored_study(
                    study_storage(settings.study_dir), settings, study_definition(settings, params, overrides)
                )
            print("check_only: the search passes its checks (its settings, the space, the trials' configs, the study "
                  "it continues); no trial was started")  # fmt: skip
            return
        new_dir = not settings.study_dir.exists()
        try:
            settings.study_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # (a traceback: search.dir=/proc/x, a read-only folder)
            raise ConfigError(f"search.dir={settings.study_dir} cannot be made ({err.strerror}): give a folder "
                              "that can be written") from None  # fmt: skip
        lock = hold_lock(settings.study_dir)  # held until the search and every trial it started have ended
        if start is TrialProcess:
            start = partial(TrialProcess, inherit=(lock.fileno(),))
        study = open_study(settings, params, overrides, cfg, baseline)
    except ConfigError as err:
        fail(err)

    requeue_interrupted(study, settings.study_dir / "trials", settings.metric)
    total = trials_to_run(study, settings, grid)
    failures = FailureLimit(settings.max_failures)

    def objective(trial: optuna.Trial) -> float:
        # An interrupted trial's parameters run again in its folder: its training continues from its checkpoint.
        folder = trial.user_attrs.get("continues", trial.number)
        run_dir = settings.study_dir / "trials" / str(folder)
        trial_overrides = [
            f"experiment={hydra_value(study.study_name)}",  # the wandb group (a user's experiment=... wins)
            *overrides,
            *(param.override(param.suggest(trial)) for param in params),
            f"hydra.run.dir={hydra_value(str(run_dir))}",
            f"epoch_metrics={hydra_value(str(run_dir / 'epochs.jsonl'))}",
        ]
        if cfg.logger:
            trial_overrides.append(f"++logger.name={hydra_value(f'{study.study_name}-trial-{folder}')}")  # its run
        with slots.take() as devices:
            command = [*trial_command(preset, processes), *trial_overrides]
            env = {**devices, "MASTER_PORT": str(free_port())}
            try:
                return run_trial(trial, start, command, env, run_dir, settings.metric)
            except TrialFailed as err:
                print(err, flush=True)  # one line; Optuna records the trial as failed
                raise
            except MetricMissing:  # every trial would fail so: stop them all
                study.stop()
                stop_all()
                raise

    results = partial(write_results, study, settings, params, overrides, groups, processes, preset)
    signal.signal(signal.SIGTERM, partial(stop_search, results))
    signal.signal(signal.SIGINT, partial(stop_search, results))
    for handler in logging.getLogger("optuna").handlers:
        handler.addFilter(without_failed_trials)
    print(f"study {study.study_name} in {settings.study_dir}: {finished(study)} of {total} trials finished", flush=True)
    try:
        while not failures.reached and (left := total - finished(study)) > 0:  # failed trials are replaced
            if grid:
                queue_grid_points(study, grid, settings.seed, left)
                if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    break  # every point trained (left over: failures the loop would replace)
            jobs = min(settings.n_jobs, left)
            study.optimize(objective, n_trials=left, n_jobs=jobs, catch=(TrialFailed,), callbacks=[failures])
    except MetricMissing as err:
        if new_dir:  # a study that could not run one trial: nothing of it is kept
            shutil.rmtree(settings.study_dir)
        fail(err)
    summarize(study, settings, params, overrides, cfg, groups, processes)
    if failures.reached:
        log = failures.last.user_attrs.get("log", "no log")
        why = f"{failures.in_a_row} trials in a row failed; the last one's log: {log}"
        print(f"error: search stopped: {why}", file=sys.stderr)
        sys.exit(1)


def compose_training(overrides: list[str]) -> tuple[DictConfig, dict[str, str]]:
    """The training config these overrides give, and its config group choices (strategy=..., model=...)."""
    register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"training overrides {' '.join(overrides)}: {str(err).splitlines()[0]}") from None
    return cfg, dict(cfg.hydra.runtime.choices)


def check_trial_config(params: list[Param], overrides: list[str]) -> DictConfig:
    """A searched key is not also set on the command line, and a trial's overrides compose: the config of a
    first trial (each parameter at its first grid value or its low end), with its Hydra config."""
    given = {override.lstrip("+~").partition("=")[0] for override in overrides}
    both = [param.key for param in params if param.key.lstrip("+") in given]
    if both:
        raise ConfigError(f"{', '.join(both)} is both searched and set on the command line; drop one")
    sample = [param.override(param.grid[0] if param.grid else param.distribution.low) for param in params]
    return compose_training([*overrides, *sample])[0]


# At most this many configs are checked beside the first trial's (each a compose and the training's checks).
MOST_OTHER_CONFIGS = 16


def other_trial_configs(params: list[Param], overrides: list[str]) -> Iterator[DictConfig]:
    """The first trial's config with one parameter at another of its values (its other grid values or choices, or
    its high end), composed only as they are asked for."""
    first = [param.grid[0] if param.grid else param.distribution.low for param in params]
    others = [
        (index, value)
        for index, param in enumerate(params)
        for value in (param.grid[1:] if param.grid else [param.distribution.high])
    ]
    for index, value in others[:MOST_OTHER_CONFIGS]:
        values = [*first[:index], value, *first[index + 1 :]]
        yield compose_training([*overrides, *(param.override(v) for param, v in zip(params, values, strict=True))])[0]


def trial_starter(settings: Settings, cfg: DictConfig, preset: str) -> tuple[DeviceSlots, StartTrial]:
    """Where trials run: as local processes on their own devices, or as SLURM jobs (SLURM picks the devices)."""
    processes = processes_per_trial(cfg.trainer.devices, preset)
    if settings.backend == "slurm":
        gpus = gpus_per_trial(settings, cfg.trainer.accelerator, processes)
        executor = slurm_executor(settings, tasks=slurm_tasks(preset, processes or 1), gpus=gpus)
        return DeviceSlots([{}] * settings.n_jobs), partial(SlurmTrial, executor)
    cpu = cfg.trainer.accelerator == "cpu"
    return DeviceSlots(local_devices(settings.n_jobs, processes, cpu)), TrialProcess


def hold_lock(study_dir: Path) -> Any:
    """One search per study at a time (the lock ends with the process, however it ends): then a trial found
    running when a search starts was interrupted, and can be re-queued."""
    lock = open(study_dir / "search.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(
            f"another search is running study {study_dir}, or a trial of a killed one is still stopping (its guard "
            f"ends it within about {GRACE_SECONDS} s; a process holds {study_dir / 'search.lock'}: fuser -v it); wait "
            "for it or stop it first"
        ) from None
    return lock


def open_study(
    settings: Settings,
    params: list[Param],
    overrides: list[str],
    cfg: DictConfig,
    baseline: dict[str, Any] | None,
) -> optuna.Study:
    """Create the study, or load it to continue. Journal storage: an append-only file that several threads
    (n_jobs) and processes can write under a file lock, where a crash loses at most the line being written;
    SQLite would need SQLAlchemy and fails with "database is locked" under concurrent writers on a shared disk."""
    storage = study_storage(settings.study_dir)
    definition = study_definition(settings, params, overrides)
    study = check_stored_study(storage, settings, definition)  # (the study to continue, read once)
    try:
        study = study or optuna.create_study(
            study_name=settings.study_name, storage=storage, direction=settings.direction
        )
    except ValueError as err:
        raise ConfigError(f"study {settings.study_name}: {err}") from None
    if study.user_attrs.get("definition") is None:
        if settings.direction == "minimize" and "acc" in settings.metric.rsplit("/", 1)[-1]:
            print(f"note: search.direction=minimize: the best trial is the lowest {settings.metric} (for accuracy: "
                  "search.direction=maximize)", file=sys.stderr)  # fmt: skip
        study.set_user_attr("definition", definition)
    # the current values of the searched keys, as a trial of their own (a study continued with search.baseline=true
    # that had none: it was taken without a word)
    if baseline is not None and not any(trial.user_attrs.get("baseline") for trial in study.get_trials(deepcopy=False)):
        study.enqueue_trial(baseline, user_attrs={"baseline": True})
    # Seeded by how many trials the study has: a re-run continues the sequence instead of drawing again the
    # parameters its first run drew.
    study.sampler = make_sampler(settings, seed=settings.seed + len(study.trials))
    study.pruner = make_pruner(settings, cfg)
    return study


def study_storage(study_dir: Path) -> optuna.storages.JournalStorage:
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(study_dir / "journal.log")))


def study_definition(settings: Settings, params: list[Param], overrides: list[str]) -> dict[str, Any]:
    """What a study is continued with only if it is the same: its space, training overrides and metric."""
    space = {param.key: repr(param.distribution) for param in params}
    # (check_only=true asks whether the study continues with the rest: not a term of it)
    overrides = [override for override in overrides if override.lstrip("+~").partition("=")[0] != "check_only"]
    return json.loads(json.dumps({"space": space, "overrides": overrides, "metric": settings.metric}))


def check_stored_study(
    storage: optuna.storages.BaseStorage, settings: Settings, definition: dict[str, Any]
) -> optuna.Study | None:
    """The study the folder holds to continue (None: none yet), refused on other terms: another study, another
    direction (Optuna takes a study again without a word about it), another definition. Writes nothing (check_only
    runs it too)."""
    names = optuna.get_all_study_names(storage)
    others = sorted(set(names) - {settings.study_name})
    if others:  # its trial folders would be taken for this study's: the other study's checkpoints, continued
        raise ConfigError(
            f"search.dir={settings.study_dir} holds study {others[0]}: give each study its own folder (the default, "
            f"outputs/search/<study>), or continue that one with search.study={others[0]}"
        )
    if settings.study_name not in names:
        return None
    study = optuna.load_study(study_name=settings.study_name, storage=storage)
    started, stored = study.user_attrs.get("definition"), study.direction.name.lower()
    if stored != settings.direction:
        metric = (started or {}).get("metric", settings.metric)  # (its own, not this one's)
        raise ConfigError(
            f"study {settings.study_name} in {settings.study_dir} was started to {stored} {metric}; continue it "
            f"with search.direction={stored}, or start a new one with search.study=<name>"
        )
    if started is not None and (changed := changed_definition(started, definition)):
        raise ConfigError(
            f"study {settings.study_name} in {settings.study_dir} was started with {changed}; continue it with the "
            "command that started it, or start a new one with search.study=<name>"
        )
    return study


def changed_definition(started: dict[str, Any], now: dict[str, Any]) -> str:
    """What differs between the study's definition when it started and now ("" for nothing): the training overrides
    (in any order: Hydra applies config groups first, then keys), the metric, the space's keys and distributions."""

    def same(then: list[str], here: list[str]) -> bool:  # (a key given twice, or ~key then +key: in order)
        keys = [override.lstrip("+~").partition("=")[0] for override in then]
        return sorted(then) == sorted(here) if len(set(keys)) == len(keys) else then == here

    if not same(started["overrides"], now["overrides"]):
        then, here = (" ".join(definition["overrides"]) or "none" for definition in (started, now))
        return f"other training overrides ({then}, now {here})"
    if started["metric"] != now["metric"]:
        return f"another search.metric ({started['metric']}, now {now['metric']})"
    was, space = started["space"], now["space"]
    for key in sorted(set(was) | set(space)):
        if was.get(key) != space.get(key):
            then, here = was.get(key, "not searched"), space.get(key, "not searched")
            return f"another search space: {key} was {then}, now {here} (the space file changed)"
    return ""


def baseline_values(params: list[Param], cfg: DictConfig) -> dict[str, Any]:
    """search.baseline=true: each searched key's value in the training config as it is (a `+KEY` the config does not
    have: its class's default), which trial 0 trains with. Refused in one line where there is none, or where it is not
    one of a categorical's choices (Optuna could not record that trial)."""
    values = {}
    for param in params:
        key = param.key.lstrip("+")
        if key in cfg.hydra.runtime.choices:  # a config group: its preset's name
            value = cfg.hydra.runtime.choices[key]
        elif (value := OmegaConf.select(cfg, key, default=NONE)) is NONE and (value := class_default(cfg, key)) is NONE:
            raise ConfigError(
                f"search.baseline=true: {param.key} has no value to start from (the training config has no {key}, nor "
                f"its class a default for it); give {key} a value in the config, or leave search.baseline=false"
            )
        choices = getattr(param.distribution, "choices", None)
        if choices is None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(
                f"search.baseline=true: {key} is {value} in the training config, not a number its trial could record; "
                f"give {key} a number in the config, or leave search.baseline=false"
            )
        if choices is not None and value not in choices:
            raise ConfigError(
                f"search.baseline=true: {key} is {value} in the training config, not one of the space's choices "
                f"{list(choices)}: add it to them, or leave search.baseline=false"
            )
        values[param.key] = value
    return values


NONE = object()  # no value in the config


def class_default(cfg: DictConfig, key: str) -> Any:
    """The default of argument `key`'s last part in the signature of the class its parent node builds (`_target_`)."""
    parent, _, name = key.rpartition(".")
    target = OmegaConf.select(cfg, f"{parent}._target_", default=None) if parent else None
    if not isinstance(target, str):
        return NONE
    try:
        argument = inspect.signature(get_object(target)).parameters.get(name)
    except (ImportError, AttributeError, ValueError, TypeError):
        return NONE
    return NONE if argument is None or argument.default is inspect.Parameter.empty else argument.default


def trials_to_run(study: optuna.Study, settings: Settings, grid: dict | None) -> int:
    """search.n_trials (a baseline trial counts in them); with a grid, at most its combinations and the baseline
    (said)."""
    if not grid:
        return settings.n_trials
    combinations = math.prod(map(len, grid.values()))
    baseline = any(trial.user_attrs.get("baseline") for trial in study.trials)
    if settings.n_trials > combinations + baseline:
        extra = " and the baseline" if baseline else ""
        print(
            f"search.n_trials={settings.n_trials}: the grid has {combinations} combinations, each trained once{extra}"
        )
    return min(settings.n_trials, combinations + baseline)


def queue_grid_points(study: optuna.Study, grid: dict[str, list[Any]], seed: int, count: int) -> None:
    """Queue the grid's points that no trial has finished, is training or waits for, or had refused by the training
    (the same point would be refused again), in the seed's order, until `count` trials wait. By hand (Optuna's
    GridSampler maps shuffled point numbers that change with its seed, counts a failed point as done, and fails on a
    queued trial: a continued search trained a point twice and another never). The baseline is none of the grid's
    points, even where its values are one's."""
    keys = sorted(grid)
    points = list(itertools.product(*(grid[key] for key in keys)))
    random.Random(seed).shuffle(points)  # several trials at once, or fewer trials than points: spread out
    active = study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING, TrialState.WAITING))
    refused = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if t.user_attrs.get("refused")]
    taken = {grid_point(trial, keys) for trial in [*active, *refused] if not trial.user_attrs.get("baseline")}
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    for point in [point for point in points if point not in taken][: max(0, count - waiting)]:
        study.enqueue_trial(dict(zip(keys, point, strict=True)))


def grid_point(trial: optuna.trial.FrozenTrial, keys: list[str]) -> tuple:
    """The values a trial was given (queued) or drew, of `keys`."""
    return tuple(given_params(trial).get(key) for key in keys)


def given_params(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The parameters a trial drew, and those it was queued with but had not drawn yet (stopped before)."""
    return {**trial.system_attrs.get("fixed_params", {}), **trial.params}


def make_sampler(settings: Settings, seed: int) -> optuna.samplers.BaseSampler:
    if settings.sampler in ("grid", "random"):  # (grid: every trial is a queued point, queue_grid_points)
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: concurrent trials (n_jobs > 1) see each other as running and do not draw the same point.
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=settings.startup_trials, constant_liar=settings.n_jobs > 1
    )


def make_pruner(settings: Settings, cfg: DictConfig) -> optuna.pruners.BasePruner:
    if settings.pruner == "median":  # stop a trial whose epoch is worse than the median of earlier trials there
        return optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials)
    if settings.pruner == "hyperband":  # successive halving over brackets of epochs
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(1, int(cfg.trainer.max_epochs)))
    return optuna.pruners.NopPruner()


def requeue_interrupted(study: optuna.Study, trials_dir: Path, metric: str) -> None:
    """Trials left running by a search that was stopped or killed. One whose training had finished (the search was
    killed before it recorded the result) is recorded from its run folder: its last epoch's `metric`. The others are
    failed now (Optuna cannot take a trial up again), and their parameters queued to run again in the same run folder,
    where the training continues from its last checkpoint."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        run_dir = trials_dir / str(trial.user_attrs.get("continues", trial.number))
        epochs = read_epoch_metrics(run_dir / "epochs.jsonl")
        if (run_dir / FINISHED_FILE).is_file() and epochs and metric in epochs[-1]:
            study.tell(trial.number, epochs[-1][metric])
            print(f"trial {trial.number} had finished: recorded from {run_dir} ({metric}={epochs[-1][metric]:.4g})")
            continue
        study.tell(trial.number, state=TrialState.FAIL)
        folder = trial.user_attrs.get("continues", trial.number)
        study.enqueue_trial(given_params(trial), user_attrs={**trial.user_attrs, "continues": folder})
        where = trials_dir / str(folder)
        saved = saved_checkpoint(where)
        how = "continues from its last checkpoint" if saved else "starts over (it saved no checkpoint)"
        print(f"trial {trial.number} was interrupted: its parameters run again in a new trial, which {how} in {where}")


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


class FailureLimit:
    """Stops the study after `limit` failed trials in a row (a broken setup fails every trial)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_a_row = limit, 0
        self.last: optuna.trial.FrozenTrial | None = None

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.in_a_row = self.in_a_row + 1 if trial.state == TrialState.FAIL else 0
        if trial.state == TrialState.FAIL:
            self.last = trial
        if self.reached:
            study.stop()

    @property
    def reached(self) -> bool:
        return self.in_a_row >= self.limit


def without_failed_trials(record: logging.LogRecord) -> bool:
    """Optuna logs a failed trial as a warning with the objective's traceback; the search prints one line instead."""
    return not (record.levelno == logging.WARNING and re.match(r"Trial \d+ failed", record.getMessage()))


RESULTS_SECONDS = 10  # how long a stopped search waits for its table of trials to be written


def stop_search(results: Callable[[], Any], signum: int, frame: Any) -> None:
    """Ctrl-C or SIGTERM: stop the running trials (each saves a checkpoint and closes its wandb run), write the table
    of the trials so far, and exit at once. They stay "running" in the study; the same command continues them."""
    print(f"search stopped by {signal.Signals(signum).name}; stopping the running trials", flush=True)
    STOPPING.set()  # the trials' threads (search.n_jobs > 1) leave them running in the study: re-run next time
    try:
        stop_all()
        # In a thread: this handler may have interrupted the main thread inside the study's storage, which holds its
        # lock (not reentrant) until the handler returns; then the table is not written rather than the search hung.
        writer = threading.Thread(target=results, daemon=True)  # trials.csv, best.yaml
        writer.start()
        writer.join(RESULTS_SECONDS)
        table = "not written now (the study was busy)" if writer.is_alive() else "trials.csv"
        print(f"the trials so far: {table}; continue with the same command (a stopped trial continues from its last "
              "checkpoint)", flush=True)  # fmt: skip
    finally:  # (the trials' threads wait for ever now: nothing may unwind into Optuna's pool of them)
        os._exit(128 + signum)  # now: Optuna would otherwise start the next trial, or mark these ones failed


if __name__ == "__main__":
    main()
