"""Config helpers: the resolvers the YAML files use, and the one-line error for bad input."""

import netrc
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).parent / "configs"


class ConfigError(ValueError):
    """A setting that cannot work. train.py prints it as one line and exits before training."""


def check_group_choices(overrides: list[str]) -> None:
    """Reject `strategy=typo` (or any config group) in one line that lists the valid choices.

    Hydra would reject it too, but with a multi-line report of its search path.
    """
    for override in overrides:
        group, has_value, choice = override.lstrip("+").partition("=")
        if has_value and (CONFIG_DIR / group).is_dir() and "," not in choice:  # "a,b" is a --multirun sweep
            choices = sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))
            if choice not in choices:
                raise ConfigError(f"unknown {group} {choice!r}; valid: {', '.join(choices)}")


def run_stamp() -> str:
    """Name of the run folder. Processes started by torchrun share its run id, so they share one folder."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"torchrun-{run_id}"
    return time.strftime("%Y-%m-%d_%H-%M-%S")


def has_wandb_credentials() -> bool:
    """True if wandb could log in without asking: an API key in the environment or in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def wandb_mode() -> str:
    """WANDB_MODE if set; else online with credentials, offline without (never a login prompt)."""
    return os.environ.get("WANDB_MODE") or ("online" if has_wandb_credentials() else "offline")


def register_resolvers() -> None:
    for name, resolver in {"run_stamp": run_stamp, "wandb_mode": wandb_mode}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def fail(error: Exception, run_dir: Path | None = None) -> None:
    """Report a predictable mistake in one line, remove the run folder if nothing was written, exit 2."""
    print(f"error: {error}", file=sys.stderr)
    if run_dir is not None and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()
    sys.exit(2)
