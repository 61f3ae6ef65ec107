"""Config helpers: the resolvers the YAML files use, and the one-line errors (bad input, a crashed process)."""

import importlib.util
import json
import pydoc
import re
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError, InterpolationToMissingValueError, MissingMandatoryValue

from .tracking import wandb_mode

CONFIG_DIR = Path(__file__).parent / "configs"
SHAPES_FILE = "shapes.json"  # in a data=streaming folder: num_features, sample_shape, num_classes, splits


class ConfigError(ValueError):
    """A setting that cannot work. train.py prints it as one line and exits before training."""


class ProcessCrashed(RuntimeError):
    """A training process that this command started (strategy=ddp_spawn) crashed: a bug, not bad input. Its
    traceback is in the output already; the message names the process and the exception in one line."""

    def __init__(self, rank: int, traceback: str) -> None:
        lines = traceback.strip().splitlines()
        super().__init__(f"training process {rank} failed: {lines[-1] if lines else 'no message'} (traceback above)")


class TrainingStopped(RuntimeError):
    """The training stopped itself for a reason it can name (e.g. out-of-memory errors that keep coming): train.py
    prints it as one line and exits 1, keeping what the run wrote (its checkpoints)."""


def spawned_failure(rank: int, traceback: str, config_errors: tuple[type, ...] = ()) -> Exception:
    """What a process this command spawned (strategy=ddp_spawn) died of, from its traceback's text, as this command
    reports it: a stop or a refusal (TrainingStopped, ConfigError or one of `config_errors`) as the one line it
    would be without the spawn; anything else, a bug, as ProcessCrashed, after printing the traceback."""
    lines = traceback.strip().splitlines()
    name, _, message = (lines[-1] if lines else "").partition(": ")  # "package.module.Class: message"
    raised = pydoc.locate(name) if name.replace(".", "").replace("_", "").isalnum() else None
    if isinstance(raised, type) and issubclass(raised, TrainingStopped):
        return TrainingStopped(message)
    if isinstance(raised, type) and issubclass(raised, (ConfigError, *config_errors)):
        return ConfigError(message)
    print(traceback, file=sys.stderr)
    return ProcessCrashed(rank, traceback)


def check_group_choices(overrides: list[str]) -> None:
    """Reject `strategy=typo` (or any config group) in one line that lists the valid choices.

    Hydra would reject it too, but with a multi-line report of its search path. Extra config folders
    (--config-dir, hydra.searchpath) can add choices, so then Hydra alone checks.
    """
    if any(arg.startswith(("--config-dir", "-cd", "hydra.searchpath")) for arg in overrides):
        return
    for override in overrides:
        group, has_value, choice = override.lstrip("+").partition("=")
        if has_value and (CONFIG_DIR / group).is_dir() and "," not in choice:  # "a,b" is a --multirun sweep
            choices = sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))
            if choice not in choices:
                raise ConfigError(f"unknown {group} {choice!r}; valid: {', '.join(choices)}")


def run_cli(run: Callable[[], None]) -> None:
    """The command line: an unknown config group choice, or a multi-node launch without a run id, is refused in
    one line, then Hydra runs `run`."""
    from .launcher import check_run_id

    try:
        check_group_choices(sys.argv[1:])
        check_run_id(sys.argv[1:])
    except ConfigError as err:
        fail(err)
    run()


def register_resolvers() -> None:
    from .files import resolve as data_files  # these modules raise this module's ConfigError
    from .launcher import default_run_id

    resolvers = {
        "default_run_id": default_run_id,
        "wandb_mode": wandb_mode,
        "data_files": data_files,
        "data_streaming": streamed_shapes,
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def streamed_shapes(dir: str | None, key: str) -> object:
    """The `data_streaming` resolver: ${data_streaming:DIR,num_features|sample_shape|num_classes|splits}, read from
    DIR/shapes.json (written by the conversion, streaming.py). A bucket's is not read: give them on the command line.
    Also where a missing litdata (an optional dependency) is reported, before anything is built."""
    convert = "python -m {{ cookiecutter.package_name }}.streaming FILES_DIR DIR"
    if importlib.util.find_spec("litdata") is None:
        raise ConfigError("data=streaming needs litdata: pip install 'litdata>=0.2.70,<0.3' (the [streaming] extra)")
    if not dir:
        raise ConfigError(f"data.dir is not set: data=streaming data.dir=DIR, DIR written by {convert}")
    if "://" in dir:
        raise ConfigError(
            f"data.{key} is not read from {dir}: give data.num_features, data.num_classes and data.splits (from its "
            f"{SHAPES_FILE}) on the command line"
        )
    path = Path(dir).expanduser() / SHAPES_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: not found; data=streaming reads a folder written by {convert}")
    return json.loads(path.read_text())[key]


def not_importable(error: Exception) -> ConfigError | None:
    """The one-line ConfigError for Hydra's report of a `_target_` it cannot import (a typo, a package that is not
    installed or not on the Python path), which is several lines; None for any other error of instantiate."""
    first, _, rest = str(error).partition("\n")
    target = re.match(r"Error locating target '(.+?)'", first)
    if target is None:
        return None
    key = re.search(r"full_key: (\S+)", rest)
    cause = error
    while cause.__cause__ is not None:  # down to the import's own error, e.g. "No module named 'my_pkg'"
        cause = cause.__cause__
    return ConfigError(
        f"{key.group(1) + '.' if key else ''}_target_={target.group(1)} cannot be imported "
        f"({str(cause).splitlines()[0]}); give the full import path of a class whose package is installed or on "
        "PYTHONPATH"
    )


UNRESOLVED = (InterpolationResolutionError, MissingMandatoryValue)  # what OmegaConf raises for the two below


def unresolved(error: Exception) -> ConfigError:
    """The ConfigError behind an OmegaConf error: a resolver's (OmegaConf wraps it, e.g. data=files checking its
    files), or a required value (???) left unset. Anything else is re-raised."""
    if isinstance(error.__context__, ConfigError):
        return error.__context__
    if isinstance(error, MissingMandatoryValue | InterpolationToMissingValueError):
        key = str(error).splitlines()[0].rpartition("Missing mandatory value: ")[2]
        return ConfigError(f"{key} is not set: give it on the command line ({key}=...)")
    raise error


def fail(error: Exception, run_dir: Path | None = None) -> None:
    """Report a predictable mistake in one line, remove the run folder if nothing was written, exit 2.
    A crashed process, or a training that stopped itself, exits 1 instead, keeping what the run wrote."""
    print(f"error: {error}", file=sys.stderr)
    if isinstance(error, ProcessCrashed | TrainingStopped):
        sys.exit(1)
    if run_dir is not None:
        remove_if_empty(run_dir)
    sys.exit(2)


def remove_if_empty(run_dir: Path) -> None:
    """Remove the run folder Hydra made for a run that wrote nothing, and the empty folders above it."""
    run_dir, cwd = run_dir.resolve(), Path.cwd().resolve()
    while run_dir.is_dir() and not any(run_dir.iterdir()) and run_dir != cwd:
        run_dir.rmdir()
        if cwd not in run_dir.parents:
            break  # outside the working directory: remove the run folder itself only
        run_dir = run_dir.parent
