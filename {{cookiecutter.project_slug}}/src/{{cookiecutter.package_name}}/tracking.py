"""Weights & Biases glue that Lightning's WandbLogger leaves to the user: offline without credentials,
the run's full config, and a finish that always happens, even when training fails."""

import netrc
import os
from typing import Any
from urllib.parse import urlparse

import lightning as L
import wandb
from lightning.pytorch.loggers import WandbLogger


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


def log_run_config(trainer: L.Trainer, config: dict[str, Any]) -> None:
    """Record the resolved config (and how the run is laid out) in every logger; rank 0 only."""
    for logger in trainer.loggers:
        logger.log_hyperparams(config)


def finish_wandb(trainer: L.Trainer, failed: bool) -> None:
    """Close this process's wandb run; for an offline run, say how to upload it."""
    if not any(isinstance(logger, WandbLogger) for logger in trainer.loggers) or wandb.run is None:
        return
    run = wandb.run
    offline = run.settings.mode == "offline"
    wandb.finish(exit_code=1 if failed else 0)
    if offline:
        print(f"wandb: offline run saved; upload it with: wandb sync {run.settings.sync_dir}")
