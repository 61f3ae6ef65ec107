"""Hydra glue shared by every command: the config folder, the command-line pre-checks, the resolvers the YAML
files use and building objects from configs with one-line errors."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from .data.files import resolve as data_files
from .data.streaming_shapes import streamed_shapes
from .errors import ConfigError, fail, not_importable
from .parallel.launcher import check_run_id, default_run_id
from .runtime.interrupt import continue_last
from .tracking.wandb_run import wandb_mode

CONFIG_DIR = Path(__file__).parent / "configs"


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
    one line; run_id=last becomes the id of the run to continue; then Hydra runs `run`."""
    try:
        check_group_choices(sys.argv[1:])
        check_run_id(sys.argv[1:])
        sys.argv[1:] = continue_last(sys.argv[1:])
    except ConfigError as err:
        fail(err)
    run()


def register_resolvers() -> None:
    resolvers = {
        "default_run_id": default_run_id,
        "wandb_mode": wandb_mode,
        "data_files": data_files,
        "data_streaming": streamed_shapes,
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def build_object(node: DictConfig, *, bad_arguments: tuple[type[Exception], ...] = (), **kwargs: Any) -> Any:
    """hydra.utils.instantiate, with a bad argument (ValueError, TypeError or one of `bad_arguments`) or a target
    that does not import reported as a ConfigError instead of a traceback."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, (ValueError, TypeError, *bad_arguments)):
            raise ConfigError(f"{node.get('_target_', 'config')}: {cause}") from err
        if (unimportable := not_importable(err)) is not None:  # e.g. data.dataset._target_=my_pkg.Typo
            raise unimportable from err
        raise
