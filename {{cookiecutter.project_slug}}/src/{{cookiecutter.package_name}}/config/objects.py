"""The resolvers the YAML files use (and the one line for a ${...} that cannot be resolved), and objects built from
config nodes with a one-line error naming what the class takes."""

import difflib
import inspect
from collections.abc import Callable
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    InterpolationKeyError,
    InterpolationResolutionError,
    InterpolationToMissingValueError,
    MissingMandatoryValue,
    UnsupportedInterpolationType,
)

from ..data.files import resolve as data_files
from ..data.streaming_shapes import streamed_shapes
from ..errors import ConfigError, not_importable
from ..parallel.launcher import default_run_id
from ..runtime.metrics import best_mode
from ..tracking.wandb_run import wandb_mode

RESOLVERS = {  # the ${name:...} the configs use
    "data_files": data_files,
    "data_streaming": streamed_shapes,
    "default_run_id": default_run_id,
    "wandb_mode": wandb_mode,
    "best_mode": best_mode,
}


def register_resolvers() -> None:
    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def unresolved(error: Exception) -> ConfigError:
    """The ConfigError behind an OmegaConf error: a resolver's (OmegaConf wraps it, e.g. data=files checking its
    files), a required value (???) left unset, or a ${...} that cannot be resolved (a typo in the key it names or
    in a resolver's name: OmegaConf's traceback before). Anything else is re-raised."""
    if isinstance(error.__context__, ConfigError):
        return error.__context__
    if isinstance(error, MissingMandatoryValue | InterpolationToMissingValueError):
        key = str(error).splitlines()[0].rpartition("Missing mandatory value: ")[2]
        return ConfigError(f"{key} is not set: give it on the command line ({key}=...)")
    if isinstance(error, InterpolationResolutionError):
        hint = ""
        if isinstance(error, InterpolationKeyError):
            hint = "; a ${...} names another setting by its full key, e.g. ${data.num_features}"
        if isinstance(error, UnsupportedInterpolationType):
            hint = f"; the resolvers: {', '.join(RESOLVERS)}, and OmegaConf's (oc.env, ...)"
        where = getattr(error, "full_key", None) or "a ${...} of the config"  # (not known where Hydra resolves it)
        return ConfigError(f"{where} cannot be resolved: {str(error).splitlines()[0]}{hint}")
    raise error


def build_object(node: DictConfig, *, bad_arguments: tuple[type[Exception], ...] = (), **kwargs: Any) -> Any:
    """hydra.utils.instantiate, with a bad argument (ValueError, TypeError or one of `bad_arguments`), a target
    that does not import, or a package it asks for that is not installed (ImportError: e.g. Lightning's
    trainer.accelerator=tpu without torch_xla) reported as a ConfigError instead of a traceback."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ConfigError):  # the object's own refusal says what is valid
            raise cause from err
        if (unimportable := not_importable(err)) is not None:  # e.g. data.dataset._target_=my_pkg.Typo
            raise unimportable from err
        if isinstance(cause, (ValueError, TypeError, ImportError, *bad_arguments)):
            raise ConfigError(f"{node.get('_target_', 'config')}: {cause}{_arguments_taken(node, cause)}") from err
        raise


def named_arguments(function: Callable[..., Any]) -> list[str]:
    """The arguments `function` takes by name (not *args, **kwargs)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name, p in inspect.signature(function).parameters.items() if p.kind in kinds]


def _arguments_taken(node: DictConfig, cause: Exception) -> str:
    """For "got an unexpected keyword argument 'X'": the arguments the class takes, and the nearest to X."""
    unexpected = str(cause).partition("unexpected keyword argument ")[2].strip("'\"")
    try:
        names = named_arguments(get_object(node._target_))
    except (AttributeError, TypeError, ValueError, ImportError):
        return ""
    if not unexpected or not names:
        return ""
    near = difflib.get_close_matches(unexpected, names, n=1, cutoff=0.75)
    return f"; it takes {', '.join(names)}" + (f" (did you mean {near[0]}?)" if near else "")
