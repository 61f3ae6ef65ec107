"""A search space: a YAML file mapping training config keys to the distributions their trials draw from.

    model.optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true, grid: [3.0e-4, 3.0e-3]}
    model.net.hidden: {type: categorical, choices: [64, 128, 256]}
    strategy: {type: categorical, choices: [single, ddp]}     # a config group: its choices are file names

Every key and distribution is checked against the composed training config before the first trial.
"""

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config import CONFIG_DIR
from ..config.settings import wrong_type
from ..errors import ConfigError

SPACES_DIR = CONFIG_DIR / "search"
FIELDS = {
    "float": {"type", "low", "high", "log", "step", "grid"},
    "int": {"type", "low", "high", "log", "step", "grid"},
    "categorical": {"type", "choices"},
}


@dataclass
class Param:
    key: str  # the training config key, e.g. model.optimizer.lr
    distribution: optuna.distributions.BaseDistribution
    grid: list[Any]  # the values search.sampler=grid tries

    def suggest(self, trial: optuna.Trial) -> Any:
        dist = self.distribution
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            return trial.suggest_categorical(self.key, dist.choices)
        suggest = trial.suggest_float if isinstance(dist, optuna.distributions.FloatDistribution) else trial.suggest_int
        return suggest(self.key, dist.low, dist.high, log=dist.log, step=dist.step)

    def override(self, value: Any) -> str:
        return f"{self.key}={hydra_value(value)}"


def space_path(space: str) -> Path:
    """configs/search/<space>.yaml, or the YAML file `space` names."""
    if space.endswith((".yaml", ".yml")) and Path(space).is_file():
        return Path(space)
    if space.endswith((".yaml", ".yml")) and "/" in space:
        raise ConfigError(f"search={space}: there is no such file")
    choices = sorted(path.stem for path in SPACES_DIR.glob("*.yaml"))
    if space not in choices:
        raise ConfigError(f"unknown search space {space!r}; valid: {', '.join(choices)}, or a path to a .yaml file")
    return SPACES_DIR / f"{space}.yaml"


def load_space(path: Path, cfg: DictConfig, groups: dict[str, str]) -> list[Param]:
    """The space's parameters, each checked against the training config `cfg` (whose config group choices
    are `groups`). Raises ConfigError naming the valid keys, types or fields."""
    try:
        entries = OmegaConf.to_container(OmegaConf.load(path))
    except (yaml.YAMLError, OmegaConfBaseException) as err:
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None) or err  # yaml's
        at = f", line {mark.line + 1} column {mark.column + 1}" if mark else ""  # (yaml counts from 0)
        raise ConfigError(f"search space {path} is not valid YAML{at}: {problem}") from None
    if not isinstance(entries, dict) or not entries:
        raise ConfigError(f"search space {path} must map config keys to distributions, e.g. model.optimizer.lr: ...")
    return [parse_param(key, spec, cfg, groups) for key, spec in entries.items()]


def parse_param(key: str, spec: Any, cfg: DictConfig, groups: dict[str, str]) -> Param:
    check_key(key, cfg, groups)
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in FIELDS:
        raise ConfigError(f"{key}: give a distribution with type: {', '.join(FIELDS)} (got {spec!r})")
    unknown = set(spec) - FIELDS[kind]
    if unknown:
        raise ConfigError(
            f"{key}: unknown field {', '.join(sorted(unknown))}; valid for {kind}: {', '.join(sorted(FIELDS[kind]))}"
        )
    if key in groups and kind != "categorical":
        raise ConfigError(f"{key} is a config group: give its choices (type: categorical)")
    try:
        if kind == "categorical":
            choices = spec.get("choices")
            if not (isinstance(choices, list) and choices):
                raise ValueError(f"choices: {choices!r}: give a non-empty list of choices, e.g. [0.001, 0.01]")
            if key in groups:
                check_searched_choices(key, choices)
            now = OmegaConf.select(cfg, key.lstrip("+"), default=None)
            for choice in choices:  # (each trial given `abc` failed, and the search went on)
                if wrong := wrong_type(key, now, choice):
                    raise ValueError(f"the choice {choice} {wrong}")
            return Param(key, optuna.distributions.CategoricalDistribution(choices), choices)
        number = float if kind == "float" else int
        now = OmegaConf.select(cfg, key.lstrip("+"), default=None)
        if kind == "float" and isinstance(now, int) and not isinstance(now, bool):
            raise ValueError(f"the training takes a whole number ({now} now): give type: int")
        if kind == "int":  # (int(1.5) drew from 1: silently another range)
            given = {name: spec.get(name) for name in ("low", "high", "step")}
            given |= {f"grid[{i}]": value for i, value in enumerate(spec.get("grid") or [])}
            for name, value in given.items():
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError(f"{name}: {value} is not a whole number (type: int; type: float for fractions)")
        low, high = (number(spec[bound]) for bound in ("low", "high"))
        log, step, grid = spec.get("log") or False, spec.get("step"), spec.get("grid")  # (null: not given)
        if not isinstance(log, bool):  # ("no" in quotes is text, which bool() took for true)
            raise ValueError(f"log: {log!r} must be true or false")
        if step is not None and not (isinstance(step, int | float) and not isinstance(step, bool) and step > 0):
            raise ValueError(f"step: {step!r} must be a number > 0 (or leave it out)")  # (0 became a step of 1)
        if grid is not None and not isinstance(grid, list):  # ("'float' object is not iterable")
            raise ValueError(f"grid: {grid!r}: give a list of values, e.g. [{grid!r}]")
        if kind == "float":
            distribution = optuna.distributions.FloatDistribution(low, high, log=log, step=step and float(step))
        else:
            distribution = optuna.distributions.IntDistribution(low, high, log=log, step=int(step or 1))
        grid = [number(value) for value in grid or default_grid(distribution)]
        outside = [value for value in grid if not low <= value <= high]
        if outside:
            raise ValueError(f"grid values {outside} lie outside [{low}, {high}]")
        return Param(key, distribution, grid)
    except KeyError as err:
        raise ConfigError(f"{key}: a {kind} needs low and high (missing {err})") from None
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{key}: {err}") from None


def default_grid(distribution: optuna.distributions.BaseDistribution) -> list[Any]:
    """Without a `grid` list, a stepped range is its own grid; a continuous one has none (refused for grid)."""
    step = getattr(distribution, "step", None)
    if step is None:
        return []
    count = math.floor((distribution.high - distribution.low) / step + 1e-9) + 1
    return [round(distribution.low + i * step, 12) for i in range(count)]  # (0.1 x 3 is 0.30000000000000004)


def check_key(key: str, cfg: DictConfig, groups: dict[str, str]) -> None:
    """An existing config key or config group; else name the keys that exist where the path stops. `+KEY` adds a key
    the config does not have (a setting of your own model): composing the first trial's config checks it."""
    if key in groups or key.startswith("+"):
        return
    missing = object()
    value = OmegaConf.select(cfg, key, default=missing)
    if isinstance(value, DictConfig):  # (every trial refused it, after the study was written)
        settings = [str(name) for name in value if not str(name).startswith("_")]
        raise ConfigError(
            f"{key} in the search space is a group of settings, not one: search one of them ({', '.join(settings)}), "
            f"e.g. {key}.{settings[0] if settings else '<setting>'}"
        )
    if value is not missing:
        return
    found: list[str] = []  # the longest prefix of the key that is a config node
    for part in key.split(".")[:-1]:
        if not isinstance(OmegaConf.select(cfg, ".".join([*found, part])), DictConfig):
            break
        found.append(part)
    parent = ".".join(found)
    node = OmegaConf.select(cfg, parent) if parent else cfg
    valid = [name for name in node if not str(name).startswith("_")] if isinstance(node, DictConfig) else []
    where = f" under {parent}" if parent else ""
    raise ConfigError(
        f"unknown config key {key} in the search space; valid{where}: {', '.join(map(str, valid))} (a key the config "
        f"does not have, e.g. an argument of your own model: +{key})"
    )


def check_searched_choices(group: str, choices: list[Any]) -> None:
    """The choices a search space gives a config group (strategy: [ddp, pipeline]) exist under configs/<group>/."""
    valid = sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))
    unknown = [choice for choice in choices if choice not in valid]
    if unknown:
        raise ValueError(f"unknown {group} {', '.join(map(str, unknown))}; valid: {', '.join(valid)}")


def grid_space(params: list[Param]) -> dict[str, list[Any]]:
    """Every parameter's grid, for Optuna's GridSampler; a continuous parameter without `grid` is refused."""
    empty = [param.key for param in params if not param.grid]
    if empty:
        raise ConfigError(f"search.sampler=grid needs values for {', '.join(empty)}: add `grid: [...]` (or a `step`)")
    return {param.key: param.grid for param in params}


def hydra_value(value: Any) -> str:
    """A value as a Hydra override writes it (floats in full precision, strings quoted when needed)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, str) and not re.fullmatch(r"[\w./:-]+", value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value) if isinstance(value, float) else str(value)
