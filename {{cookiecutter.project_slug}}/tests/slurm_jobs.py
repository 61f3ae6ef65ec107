"""The SLURM tests' helpers: whether SLURM answers here, one SLURM test at a time, a job's state, waiting on it."""

import fcntl
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "GONE"}


def slurm_missing() -> str:
    """Why SLURM cannot be used here, or "" if it can."""
    if not shutil.which("sbatch"):
        return "no SLURM here (the template's CI starts one with .ci/slurm.sh)"
    if subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode:
        return "SLURM is installed but does not answer (sinfo failed)"
    return ""


def jobs() -> list[dict[str, str]]:
    """Every job SLURM knows, as scontrol's KEY=value fields (one line per job with -o)."""
    lines = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True).stdout.splitlines()
    return [dict(word.split("=", 1) for word in line.split() if "=" in word) for line in lines]


def job_state(job_id: str) -> str:
    """The job's state; GONE once SLURM no longer knows it. A busy slurmctld can time out a query: asked again
    (on a loaded 2-core CI machine, one such timeout read as GONE failed a test)."""
    for _ in range(10):
        done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
        if "JobState=" in done.stdout:
            return done.stdout.split("JobState=")[1].split()[0]
        if "Invalid job id" in done.stderr:
            return "GONE"
        time.sleep(1)
    return "GONE"


def wait_for(condition: Callable[[], bool], job_id: str, log: Path, what: str, timeout: float = 300) -> None:
    """Poll until condition(); fail at once, with the job's log, if the job ended or the time is up."""
    deadline = time.monotonic() + timeout
    while not condition():
        state = job_state(job_id)
        # Asked again: the job may have reached the condition (e.g. ended, for a wait on its end) after it was asked.
        if (state in ENDED and not condition()) or time.monotonic() > deadline:
            output = log.read_text() if log.exists() else "(no log)"
            raise AssertionError(f"waiting for {what}: job {job_id} is {state}\n{output[-4000:]}")
        time.sleep(0.5)


@contextmanager
def node_to_myself(lock: Path, folder: Path) -> Iterator[None]:
    """Hold the SLURM node for one test, then cancel every job the test left under `folder`.

    On a small node one 2-task job fills every core, so SLURM tests running side by side (pytest-xdist workers)
    would queue behind each other's jobs and time out; a file lock makes them take turns.
    """
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            left = [job["JobId"] for job in jobs() if job.get("JobState") not in ENDED and under(job, folder)]
            if left:
                subprocess.run(["scancel", *left], capture_output=True)


def under(job: dict[str, str], folder: Path) -> bool:
    return any(job.get(key, "").startswith(str(folder)) for key in ("WorkDir", "StdOut"))
