"""Weights & Biases glue that no engine gives you: offline without credentials, one wandb run per training
across restarts (never a step logged twice), and a finish that always happens (even when training fails) and
says how to upload an offline run."""

import json
import netrc
import os
import secrets
from pathlib import Path
from typing import Any
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


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of the training in `run_dir`: the one its first start kept (keep_wandb_run_id), else a new
    one. Every restart (same run folder) then resumes the same wandb run: wandb.init(id=..., resume="allow").

    A random id rather than one derived from the run id: two projects' run folders may share a SLURM job id,
    never a wandb run.
    """
    path = run_dir / "wandb" / "run_id"
    return path.read_text().strip() if path.is_file() else secrets.token_hex(4)


def keep_wandb_run_id(run_dir: Path, run_id: str) -> None:
    """Keep the id once its wandb run has started (so a run refused before training leaves no file behind)."""
    path = run_dir / "wandb" / "run_id"
    if not path.is_file():
        write_atomically(path, run_id)


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and a rename: a reader (or a restart after a kill) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


class LoggedSteps:
    """Which steps the training's wandb run already has, so that a resumed run does not log them again.

    A run resumed from its last checkpoint replays the steps between that checkpoint and the crash; they were
    logged already (with the same values, as the resume is exact), and wandb would keep both copies. The last
    logged step and its metric names live in <run_dir>/wandb/logged_step, rewritten after each log (rank 0).
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "wandb" / "logged_step"
        state = json.loads(self.path.read_text()) if self.path.is_file() else {"step": -1, "keys": []}
        self.step, self.keys = state["step"], set(state["keys"])

    def unlogged(self, metrics: dict[str, Any], step: int) -> dict[str, Any]:
        """The part of `metrics` (logged at `step`) that the wandb run does not have yet."""
        if step < self.step:
            return {}
        return {key: value for key, value in metrics.items() if step > self.step or key not in self.keys}

    def record(self, metrics: dict[str, Any], step: int) -> None:
        """Note `metrics` as logged at `step` (after wandb took them)."""
        if not metrics:
            return
        self.keys = self.keys | set(metrics) if step == self.step else set(metrics)
        self.step = step
        write_atomically(self.path, json.dumps({"step": step, "keys": sorted(self.keys)}))
