"""The same search as a wandb sweep (`--export-wandb-sweep sweep.yaml`), for users with a wandb server:
`wandb sweep sweep.yaml` registers it, `wandb agent <id>` runs its trials with the command below."""

from pathlib import Path
from typing import Any

import optuna
import yaml

from ..engine.launching import typed_command
from ..errors import ConfigError
from .settings import Settings
from .space import Param, hydra_value

METHODS = {"grid": "grid", "random": "random", "tpe": "bayes"}  # wandb's Bayesian search stands in for TPE


def write_wandb_sweep(
    path: Path, settings: Settings, params: list[Param], overrides: list[str], preset: str, processes: int
) -> None:
    if not path.parent.is_dir():
        raise ConfigError(f"--export-wandb-sweep {path}: there is no folder {path.parent} to write it in")
    if path.is_dir():  # (IsADirectoryError's traceback)
        raise ConfigError(f"--export-wandb-sweep {path} is a folder: give a file name, e.g. {path / 'sweep.yaml'}")
    command = typed_command(preset, processes)
    if command[0] == "python":
        command[0] = "${interpreter}"  # the agent's Python
    # A key the training's config lacks is added (+key) in the search's space; wandb's parameter names take no +
    # (its schema refused the sweep): the command adds the key first, with a value of the space, and the agent's
    # key=value, after it, sets it.
    added = [f"{param.key}={hydra_value(a_value(param))}" for param in params if param.key.startswith("+")]
    sweep: dict[str, Any] = {
        "name": settings.study_name,
        "method": METHODS[settings.sampler],
        "metric": {"name": settings.metric, "goal": settings.direction},
        "parameters": {param.key.lstrip("+"): parameter(param, settings.sampler == "grid") for param in params},
        # ${args_no_hyphens} gives key=value per parameter: Hydra overrides as they are.
        "command": ["${env}", *command, f"experiment={settings.study_name}", *overrides, *added, "${args_no_hyphens}"],
    }
    if settings.sampler != "grid":  # (a grid ends with its points)
        sweep["run_cap"] = settings.n_trials
    if settings.pruner != "none":  # wandb stops runs early with hyperband only
        sweep["early_terminate"] = {"type": "hyperband", "min_iter": 1}
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))


def a_value(param: Param) -> Any:
    """One value of the parameter's space: its grid's first, or the low end of its range."""
    return param.grid[0] if param.grid else param.distribution.low


def parameter(param: Param, grid: bool) -> dict[str, Any]:
    """A wandb sweep parameter with the same distribution (a grid search lists the grid's values)."""
    dist = param.distribution
    if grid or isinstance(dist, optuna.distributions.CategoricalDistribution):
        return {"values": list(param.grid)}
    if isinstance(dist, optuna.distributions.IntDistribution):
        if dist.log:
            return {"distribution": "q_log_uniform_values", "min": dist.low, "max": dist.high, "q": 1}
        if dist.step != 1:
            return {"distribution": "q_uniform", "min": dist.low, "max": dist.high, "q": dist.step}
        return {"distribution": "int_uniform", "min": dist.low, "max": dist.high}
    if dist.log:
        return {"distribution": "log_uniform_values", "min": dist.low, "max": dist.high}
    if dist.step is not None:
        return {"distribution": "q_uniform", "min": dist.low, "max": dist.high, "q": dist.step}
    return {"distribution": "uniform", "min": dist.low, "max": dist.high}
