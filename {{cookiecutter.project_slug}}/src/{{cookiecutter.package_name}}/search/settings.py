"""The search's own settings (`search.<name>=...` on the command line) and how the command line is split
between them, the search space (`search=<space>`) and the training overrides (everything else)."""

from dataclasses import dataclass, fields
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..config.command_line import flag_key, not_an_option
from ..errors import ConfigError

SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "hyperband")
DIRECTIONS = ("minimize", "maximize")
BACKENDS = ("local", "slurm")


@dataclass
class Settings:
    space: str = "default"  # configs/search/<space>.yaml, or a path to a YAML file
    study: str | None = None  # the study's name: its folder, its wandb group; default: the space's name
    dir: str | None = None  # where the study lives; default: outputs/search/<study>
    n_trials: int = 20  # finished trials (complete or pruned) to reach; a re-run continues up to it
    sampler: str = "tpe"  # grid (every combination) | random | tpe (Bayesian)
    pruner: str = "median"  # none | median | hyperband, on `metric` after every epoch
    n_jobs: int = 1  # trials at once, each on its own devices
    metric: str = "val/loss"  # a validation metric, reported every epoch
    direction: str = "minimize"  # minimize | maximize
    startup_trials: int = 5  # trials before TPE stops sampling at random and the median pruner starts pruning
    baseline: bool = False  # trial 0 runs the training config as it is, to measure what the search gains
    max_failures: int = 3  # consecutive failed trials that stop the search
    seed: int = 0  # seeds the sampler
    backend: str = "local"  # local: trials are subprocesses here; slurm: one SLURM job per trial (submitit)
    slurm_partition: str | None = None  # backend=slurm: the partition (default: the cluster's default)
    slurm_timeout_min: int = 120  # backend=slurm: a trial's time limit, in minutes
    # backend=slurm: GPUs a trial's job asks for (on its one node); default: the trial's devices when it trains
    # on GPUs (trainer.accelerator gpu, or auto on a cluster whose nodes have GPUs), else 0
    slurm_gpus_per_trial: int | None = None

    @property
    def study_name(self) -> str:
        return self.study or Path(self.space).stem

    @property
    def study_dir(self) -> Path:
        return Path(self.dir or Path("outputs", "search", self.study_name))

    def check(self) -> None:
        for name, value, valid in [
            ("sampler", self.sampler, SAMPLERS),
            ("pruner", self.pruner, PRUNERS),
            ("direction", self.direction, DIRECTIONS),
            ("backend", self.backend, BACKENDS),
        ]:
            if value not in valid:
                raise ConfigError(f"search.{name}={value!r} is unknown; valid: {', '.join(valid)}")
        for name in ("n_trials", "n_jobs", "max_failures"):
            if getattr(self, name) < 1:
                raise ConfigError(f"search.{name} must be at least 1, not {getattr(self, name)}")
        if self.startup_trials < 0:  # (Optuna's ValueError, after the study was written)
            raise ConfigError(f"search.startup_trials must be at least 0, not {self.startup_trials}")
        if not 0 <= self.seed < 2**32:  # (numpy's, through Optuna's sampler)
            raise ConfigError(f"search.seed must be a whole number from 0 to {2**32 - 1}, not {self.seed}")
        if self.study is not None and ("/" in self.study or self.study in ("", ".", "..")):
            raise ConfigError(
                f"search.study={self.study} must name one folder (outputs/search/<study>, the trials' experiment): "
                "no / or .., not empty"
            )
        if self.slurm_gpus_per_trial is not None and self.slurm_gpus_per_trial < 0:
            raise ConfigError(f"search.slurm_gpus_per_trial must be at least 0, not {self.slurm_gpus_per_trial}")
        if not self.metric.startswith("val/"):
            raise ConfigError(
                f"search.metric={self.metric} is not reported every epoch; use val/loss, val/acc, val/perplexity"
            )


def parse_command_line(args: list[str]) -> tuple[Settings, list[str], str | None]:
    """(settings, training overrides, wandb sweep file to export or None)."""
    export, rest = None, []
    args = iter(args)
    for arg in args:
        if arg == "--export-wandb-sweep":
            export = next(args, None)
            if export is None or "=" in export:  # (the next setting, taken for a file name, was dropped)
                raise ConfigError("--export-wandb-sweep needs a file name, e.g. --export-wandb-sweep sweep.yaml")
        elif arg.startswith("--export-wandb-sweep="):
            export = arg.partition("=")[2]
        elif arg.startswith("-") and not arg.lstrip("-")[:1].isdigit():  # argparse's habit: Hydra's lexer's words
            name = arg.partition("=")[0].lstrip("-").replace("-", "_")
            searched = name in [field.name for field in fields(Settings)]
            raise not_an_option(arg.partition("=")[0], f"search.{name}" if searched else flag_key(name, "train"))
        else:
            rest.append(arg)
    mine = [arg for arg in rest if arg.lstrip("+~").partition("=")[0].partition(".")[0] == "search"]
    overrides = [arg for arg in rest if arg not in mine]
    return parse_settings(mine), overrides, export


def parse_settings(args: list[str]) -> Settings:
    """`search=<space>` and `search.<name>=<value>`, checked against Settings' names and types."""
    names = [field.name for field in fields(Settings)]
    values = {}
    for arg in args:
        key, _, value = arg.partition("=")
        name = "space" if key.lstrip("+~") == "search" else key.lstrip("+~").removeprefix("search.")
        if name not in names:
            raise ConfigError(
                f"unknown setting {key}; valid: search=<space>, {', '.join('search.' + n for n in names)}"
            )
        if key != key.lstrip("+~"):  # (the training's check said no part of the training reads a search)
            shown = "search" if name == "space" else f"search.{name}"
            raise ConfigError(f"{key}: the search has every setting already, to be set without + or ~: {shown}=...")
        try:
            values[name] = yaml.safe_load(value) if value else None
        except yaml.YAMLError:  # an unclosed quote or bracket: yaml's traceback
            raise ConfigError(f"{key}={value} is not a value: close its quotes and brackets") from None
    try:
        settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Settings), values))
    except OmegaConfBaseException as err:
        raise ConfigError(f"search.{err.key}={err.value!r}: {str(err).splitlines()[0]}") from None
    settings.check()
    return settings
