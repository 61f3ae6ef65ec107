"""Weights & Biases glue that no engine gives you: offline without credentials, one wandb run per training
across restarts, and a finish that always happens (even when training fails) and says how to upload an offline
run."""

import contextlib
import netrc
import os
import pwd
import secrets
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import wandb
from wandb.sdk.mailbox import HandleAbandonedError, MailboxClosedError

from ..errors import ConfigError


def has_wandb_credentials() -> bool:
    """True if wandb could log in without asking: an API key in the environment or in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):  # (the latter: a JWT's)
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # what wandb.init's settings take


def wandb_mode() -> str:
    """WANDB_MODE if set; else online with credentials, offline without (never a login prompt). A mode wandb
    refuses is refused here in one line (wandb's refusal was a traceback once the run folder was made)."""
    give_wandb_a_cache()
    mode = os.environ.get("WANDB_MODE")
    if mode and mode not in WANDB_MODES:
        raise ConfigError(
            f"WANDB_MODE={mode} is not a wandb mode; valid: online, offline, disabled (or leave it unset: online "
            "when logged in, else offline)"
        )
    if mode in ("online", "shared", "run") and not has_wandb_credentials():  # (wandb's UsageError traceback, after the
        raise ConfigError(  # run folder was made)
            f"WANDB_MODE={mode} needs a wandb login and there is none here (WANDB_API_KEY, or ~/.netrc from `wandb "
            "login`): log in, or leave WANDB_MODE unset to log offline (wandb sync uploads it later)"
        )
    return mode or ("online" if has_wandb_credentials() else "offline")


def give_wandb_a_cache() -> None:
    """Without HOME (a container's or a batch system's bare environment) wandb's service finds no cache folder and
    logged its own 20 lines to the terminal: it gets, as XDG_CACHE_HOME, the one Python's libraries use there (the
    user's home's .cache, from the password database), or a new temporary folder for a user without a home."""
    if os.environ.get("HOME") or os.environ.get("XDG_CACHE_HOME"):
        return
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # (a container's arbitrary user id)
        home = ""
    writable = bool(home) and os.path.isdir(home) and os.access(home, os.W_OK)
    os.environ["XDG_CACHE_HOME"] = os.path.join(home, ".cache") if writable else tempfile.mkdtemp(prefix="cache-")


def finish_wandb(failed: bool) -> None:
    """Close this process's wandb run, if it has one; for an offline run, say how to upload it."""
    run = wandb.run
    if run is None:
        return
    offline = run.settings.mode == "offline"
    try:
        wandb.finish(exit_code=1 if failed else 0)
    # Its service process got the signal too (SLURM's scancel or requeue signal them all): the connection to it
    # breaks, or, when it dies while finish waits on its answer, the answer is abandoned (seen once in CI, exit 1)
    except (ConnectionError, MailboxClosedError, HandleAbandonedError):
        with contextlib.suppress(Exception):
            wandb.teardown()  # first unregisters wandb's exit hook, which would fail the same way, with a traceback
        print(
            "wandb: its service stopped with this process (a signal to every process: SLURM's scancel, requeue), so "
            "this start's wandb run was not closed; every row is in metrics.jsonl, and the next start logs what the "
            "wandb files lack",
            file=sys.stderr,
        )
        return
    if offline:  # the folder of every start of the training: wandb sync uploads those of one run in order
        folder = shlex.quote(str(Path(run.settings.sync_dir).parent))  # (for the shell: a folder with a space)
        print(f"wandb: offline run saved; upload it with: wandb sync {folder}")


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of the training in `run_dir`: the one its first start kept (keep_wandb_run_id), else a new
    one. Every restart (same run folder) then resumes the same wandb run: wandb.init(id=..., resume="allow").

    A random id rather than one derived from the run id: two projects' run folders may share a SLURM job id,
    never a wandb run.
    """
    path = run_dir / "wandb" / "run_id"
    return path.read_text().strip() if path.is_file() else secrets.token_hex(4)


def resumed_wandb_run(run_dir: Path) -> dict[str, Any]:
    """wandb.init arguments that continue the training's wandb run on every start.

    wandb writes what it is given to its run file every few seconds (15 by default); a process killed outright
    loses what was not written yet. Once a second, that loss stays within steps that a restart trains (and logs)
    again, as checkpoints are further apart. A restart trains again the steps after its checkpoint but logs only
    those that the earlier starts' run files lack (wandb_files.not_logged_yet), so each step is logged once.
    """
    settings = wandb.Settings(x_transaction_log_flush_interval=1.0)
    return {"id": wandb_run_id(run_dir), "resume": "allow", "settings": settings}


def keep_wandb_run_id(run_dir: Path, run_id: str) -> None:
    """Keep the id once its wandb run has started (so a run refused before training leaves no file behind)."""
    path = run_dir / "wandb" / "run_id"
    if not path.is_file():
        write_atomically(path, run_id)


def forget_wandb_run(run_dir: Path) -> None:
    """Start the next training in `run_dir` as a new wandb run, with a new metrics file (resume=false)."""
    (run_dir / "wandb" / "run_id").unlink(missing_ok=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # tracking/metrics_file.py


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and a rename: a reader (or a restart after a kill) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
