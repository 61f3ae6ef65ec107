"""What a search leaves behind: trials.csv, best.yaml (a config `train` runs as it is), a parallel
coordinates plot, and a wandb summary run in the study's group with the same table and plot."""

import csv
import hashlib
import shlex
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
import wandb  # noqa: E402
import yaml  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.core.override_parser.types import OverrideType  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from optuna.visualization.matplotlib import plot_parallel_coordinate  # noqa: E402

from ..config import CONFIG_DIR  # noqa: E402
from ..engine.launching import typed_command  # noqa: E402
from ..parallel.presets import built_in_preset  # noqa: E402
from ..tracking.wandb_run import wandb_mode  # noqa: E402
from .settings import Settings  # noqa: E402
from .space import Param  # noqa: E402


def summarize(
    study: optuna.Study,
    settings: Settings,
    params: list[Param],
    overrides: list[str],
    cfg: DictConfig,
    groups: dict[str, str],
    processes: int,
) -> None:
    preset = built_in_preset(groups["strategy"], cfg.strategy)
    columns, rows, rerun = write_results(study, settings, params, overrides, groups, processes, preset)
    states = [str(row[1]).removesuffix(" (baseline)").partition(",")[0] for row in rows]  # (interrupted, continued)
    counts = {state: states.count(state) for state in dict.fromkeys(states)}
    print(f"study {study.study_name}: " + ", ".join(f"{n} {state}" for state, n in counts.items()))
    plot = best = None
    if rerun:
        best = study.best_trial
        plot = save_plot(study, settings.metric, settings.study_dir / "parallel_coordinate.png")
        print(f"best: trial {best.number}, {settings.metric}={best.value:.6g}, {best.params}")
        print(f"re-run it: {rerun}")
    print(f"trials: {settings.study_dir / 'trials.csv'}")
    if cfg.logger:
        log_summary_run(study, settings, cfg, columns, rows, best, plot)


def write_results(
    study: optuna.Study,
    settings: Settings,
    params: list[Param],
    overrides: list[str],
    groups: dict[str, str],
    processes: int,
    preset: str,
) -> tuple[list[str], list[list[Any]], str | None]:
    """trials.csv, and best.yaml once a trial has completed: the table, and the command that re-runs the best
    (`preset`: the built-in one the trials' is, whose launcher it names)."""
    columns, rows = trial_table(study, params)
    with open(settings.study_dir / "trials.csv", "w", newline="") as file:
        csv.writer(file).writerows([columns, *rows])
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        return columns, rows, None
    command = typed_command(preset, processes)
    return columns, rows, write_best_config(settings.study_dir / "best.yaml", study, overrides, groups, command)


def trial_table(study: optuna.Study, params: list[Param]) -> tuple[list[str], list[list[Any]]]:
    keys = [param.key for param in params]
    columns = ["trial", "state", "value", *keys, "epochs", "seconds", "log"]
    continued: dict[int, list[int]] = {}  # a trial folder: the trials that continued its training, in order
    for trial in study.trials:
        if "continues" in trial.user_attrs:
            continued.setdefault(trial.user_attrs["continues"], []).append(trial.number)
    rows = [
        [
            trial.number,
            trial_state(trial, continued),
            trial.value,
            *(trial.params.get(key) for key in keys),
            len(trial.intermediate_values),
            round(trial.duration.total_seconds(), 1) if trial.duration else None,
            trial.user_attrs.get("log"),
        ]
        for trial in study.trials
    ]
    return columns, rows


def trial_state(trial: optuna.trial.FrozenTrial, continued: dict[int, list[int]]) -> str:
    """Optuna's state, and what the search made of the trial: the baseline, or interrupted and continued by another
    trial (failed for Optuna, which cannot take a trial up again)."""
    state = trial.state.name.lower()
    later = [n for n in continued.get(trial.user_attrs.get("continues", trial.number), []) if n > trial.number]
    if trial.state == optuna.trial.TrialState.FAIL and later:
        state = f"interrupted, continued by trial {later[0]}"
    return f"{state} (baseline)" if trial.user_attrs.get("baseline") else state


def write_best_config(
    path: Path, study: optuna.Study, overrides: list[str], groups: dict[str, str], command: list[str]
) -> str:
    """best.yaml: a primary config that composes `train` with the search's training overrides and the best
    trial's parameters, so `train --config-dir <study dir> --config-name best` re-runs the best trial.
    Overrides a config cannot hold (deletions `~key`, hydra.*) stay on the printed command line."""
    best = study.best_trial
    given = [*overrides, *(f"{key}={value}" for key, value in best.params.items())]
    defaults: list[Any] = ["train"]
    values: DictConfig = OmegaConf.create({"experiment": study.study_name})
    rest = []
    for override in OverridesParser.create().parse_overrides(given):
        key = override.key_or_group
        if override.is_delete() or override.is_sweep_override() or key.startswith("hydra"):
            rest.append(override.input_line)
        elif key in groups and (CONFIG_DIR / key).is_dir():  # a group train.yaml has: overridden; one added
            added = override.type == OverrideType.ADD  # with + (a recipe of yours): added to the list, as given
            defaults.append({f"{'' if added else 'override '}/{key}": override.value()})
        else:
            OmegaConf.update(values, key, override.value(), force_add=True)
    body = {"defaults": [*defaults, "_self_"], **OmegaConf.to_container(values)}
    rerun = " ".join([*command, "--config-dir", str(path.parent), "--config-name", path.stem, *rest])
    header = f"# Best trial ({best.number}) of study {study.study_name}: {best.value}. Re-run it with:\n#   {rerun}\n"
    path.write_text(header + yaml.safe_dump(body, sort_keys=False))
    return rerun


def save_plot(study: optuna.Study, metric: str, path: Path) -> Path:
    """Parallel coordinates: one line per trial across the parameters, coloured by the metric."""
    figure = parallel_coordinate(study, metric)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


# viridis without its last, pale yellow sixth: every line stands out from the white background
LINE_COLOURS = matplotlib.colors.ListedColormap(matplotlib.colormaps["viridis"](np.linspace(0, 0.85, 256)))


def parallel_coordinate(study: optuna.Study, metric: str) -> matplotlib.figure.Figure:
    """Optuna's plot, made readable: its colour map ("Blues") draws the worst trial almost white, and it cuts
    names longer than ~20 characters ("model.optimizer.w..."). Optuna has no option for either, so both are
    changed on its figure: the lines' colours, and each axis named in full over two lines."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", "Attempting to set identical")  # a parameter of one value: a flat axis
        axes = plot_parallel_coordinate(study, target_name=metric)
    figure = axes.figure
    for collection in (c for ax in figure.axes for c in ax.collections if c.get_array() is not None):
        collection.set_cmap(LINE_COLOURS)  # the lines and the colour bar beside them
    params = {name for trial in study.trials for name in trial.params}
    labels = [full_name(label.get_text(), params) for label in axes.get_xticklabels()]
    labels = [name.rpartition(".")[0] + "\n" + name.rpartition(".")[2] if "." in name else name for name in labels]
    axes.set_xticks(axes.get_xticks(), labels, rotation=0, ha="center", fontsize=8)
    figure.set_size_inches(max(6.4, 2.2 * len(labels)), 4.8)
    return figure


def full_name(label: str, names: set[str]) -> str:
    """The name Optuna shortened to `label` ("model.optimizer.w..."): the one it starts."""
    if not label.endswith("..."):
        return label
    return next((name for name in sorted(names) if name.startswith(label[:-3])), label)


def log_summary_run(
    study: optuna.Study,
    settings: Settings,
    cfg: DictConfig,
    columns: list[str],
    rows: list[list[Any]],
    best: optuna.trial.FrozenTrial | None,
    plot: Path | None,
) -> None:
    """One more wandb run in the study's group: the settings, the table of trials, the best trial, the plot. One run per
    study (its id from the study's folder): a search continued later updates it instead of adding another."""
    run = wandb.init(
        id=summary_run_id(study, settings.study_dir),
        resume="allow",
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        group=study.study_name,
        job_type="search",
        name=f"{study.study_name}-summary",
        dir=settings.study_dir,
        mode=wandb_mode(),
        config={"search": asdict(settings)},
    )
    summary: dict[str, Any] = {"trials": wandb.Table(columns=columns, data=[[str(v) for v in row] for row in rows])}
    if best is not None:
        summary.update({"best/value": best.value, "best/trial": best.number, "best/params": best.params})
    if plot is not None:
        summary["parallel_coordinate"] = wandb.Image(str(plot))
    run.log(summary)
    offline = run.settings.mode == "offline"
    run.finish()
    if offline:
        study_dir = settings.study_dir
        folder = shlex.quote(str(study_dir))  # (a folder with a space; the * stays the shell's)
        print(f"wandb: offline runs saved; upload them with: wandb sync {folder}/trials/*/wandb {folder}/wandb")


def summary_run_id(study: optuna.Study, study_dir: Path) -> str:
    """The wandb id of a study's summary run: its folder's, and its first trial's start (a study removed and started
    anew in the same folder, or one of a clone elsewhere at the same path, updated the earlier study's run)."""
    started = min((trial.datetime_start for trial in study.trials if trial.datetime_start), default=None)
    return "search-" + hashlib.sha1(f"{study_dir.resolve()} {started}".encode()).hexdigest()[:16]
