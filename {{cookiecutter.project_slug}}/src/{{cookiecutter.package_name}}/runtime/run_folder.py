"""One training per run folder at a time. Two commands given the same run_id (a second terminal, a job started
twice) would otherwise write into one folder together: each other's checkpoints, one metrics file and one wandb run
with every step twice. Written by hand: neither engine nor Hydra guards a run folder."""

import fcntl
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..errors import ConfigError, launch_folder
from ..parallel.launcher import is_first_process

# Set by a training command that starts its processes under torchrun (the Accelerate engine): the folder it holds
# for them, in which their first process does not ask again.
HELD_BY_THE_COMMAND = "TRAINING_RUN_FOLDER_HELD"

# The folders this process holds, open. A fork (a loader worker, ddp_spawn's processes) closes its copies: the lock
# is the open folder's, shared by every copy, so a loader worker outliving a killed training would hold it on.
_HELD: set[int] = set()


def _close_in_the_fork() -> None:
    for folder in _HELD:
        os.close(folder)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_the_fork)


class RunFolderInUse(ConfigError):
    """Refused: another training holds the run folder (which stays as that training leaves it)."""


@contextmanager
def only_training_in(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir` while the block runs, in the training's first process (the others share its folder): a lock
    on the folder itself (flock), so nothing is written, released when the process ends, however it ends. Raises
    RunFolderInUse when another process holds it. A file system without flock (some network ones) is not guarded."""
    if not is_first_process() or os.environ.get(HELD_BY_THE_COMMAND) == str(run_dir):
        yield
        return
    folder = os.open(run_dir, os.O_RDONLY)
    _HELD.add(folder)
    try:
        try:
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUse(
                f"another training is running in {run_dir} (a process holds it: fuser -v {run_dir}); wait for it "
                "to end or stop it, or give another run_id"
            ) from None
        except OSError:
            pass  # no flock here: unguarded
        yield
    finally:
        if folder in _HELD:  # (not in a fork, which closed its copy)
            _HELD.discard(folder)
            os.close(folder)  # and with it the lock


STARTS_FILE = "starts.jsonl"  # in a run folder: one line per start of its training
RECORDED_VERSIONS = ("torch", "lightning", "accelerate", "hydra-core", "wandb", "torchao", "litdata", "numpy")


def record_start(run_dir: Path, resumed_from: Path | str | None) -> None:
    """One line in the run folder per start of its training (a resume, a restart, a requeue too), by its first
    process: when, the checkpoint it continued (None: afresh), its command line's settings, the versions of Python
    and of the libraries that train, and the project's git commit with whether its files differed from it. What
    config.yaml, the resolved config of the last start alone, cannot say: with which code and settings each part
    of the run was trained, and how to run it again."""
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else sys.argv[1:]
    entry = {
        "time": datetime.now().astimezone().isoformat(timespec="seconds"),  # (with its offset: datetime.UTC is 3.11+)
        "resumed_from": str(resumed_from) if resumed_from else None,
        "overrides": overrides,
        "python": platform.python_version(),
        "versions": {name: found for name in RECORDED_VERSIONS if (found := installed(name))},
        "git": git_state(launch_folder()),
    }
    with (run_dir / STARTS_FILE).open("a") as starts:
        starts.write(json.dumps(entry) + "\n")


def installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def git_state(folder: Path) -> dict[str, object] | None:
    """The commit the project's folder is at and whether tracked files differ from it; None outside a git work tree
    (or without git)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode:
            return None
        status = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": commit.stdout.strip(), "changed_files": bool(status.stdout.strip())}
