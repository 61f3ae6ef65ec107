"""Weights & Biases glue that no engine gives you: offline without credentials, and a finish that always
happens (even when training fails) and says how to upload an offline run."""

import netrc
import os
from urllib.parse import urlparse

import wandb


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


def finish_wandb(failed: bool) -> None:
    """Close this process's wandb run, if it has one; for an offline run, say how to upload it."""
    run = wandb.run
    if run is None:
        return
    offline = run.settings.mode == "offline"
    wandb.finish(exit_code=1 if failed else 0)
    if offline:
        print(f"wandb: offline run saved; upload it with: wandb sync {run.settings.sync_dir}")
