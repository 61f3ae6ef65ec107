"""One training per run folder at a time. Two commands given the same run_id (a second terminal, a job started
twice) would otherwise write into one folder together: each other's checkpoints, one metrics file and one wandb run
with every step twice. Written by hand: neither engine nor Hydra guards a run folder."""

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError
from ..tracking.wandb_run import is_first_process


class RunFolderInUse(ConfigError):
    """Refused: another training holds the run folder (which stays as that training leaves it)."""


@contextmanager
def only_training_in(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir` while the block runs, in the training's first process (the others share its folder): a lock
    on the folder itself (flock), so nothing is written, released when the process ends, however it ends. Raises
    RunFolderInUse when another process holds it. A file system without flock (some network ones) is not guarded."""
    if not is_first_process():
        yield
        return
    folder = os.open(run_dir, os.O_RDONLY)
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
        os.close(folder)  # (and with it the lock)
