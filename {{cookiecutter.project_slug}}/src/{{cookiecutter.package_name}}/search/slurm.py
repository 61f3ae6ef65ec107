"""search.backend=slurm: each trial is one SLURM job, submitted with submitit, on a disk the search also sees.

The job runs `run_and_watch` on the node: the training as a subprocess, its output in the trial's log, and
a watch for a `stop` file in the trial's folder, which the search writes to prune or stop the trial. The job
then interrupts its training (Ctrl-C) itself, so the training closes its wandb run, as a local trial does.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import submitit

from ..errors import ConfigError
from .settings import Settings
from .trials import POLL_SECONDS, STOP_GRACE_SECONDS


def run_and_watch(command: list[str], env: dict[str, str], log: str, stop_file: str, cwd: str) -> int:
    """On the node: train until the end, or until stop_file appears; the training's exit code."""
    rank = int(os.environ.get("SLURM_PROCID", 0))
    log_path = log if rank == 0 else f"{log}.rank{rank}"
    with open(log_path, "a") as output:  # (a trial continued in its folder: after the log of its start)
        process = subprocess.Popen(command, env={**os.environ, **env}, cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
        while process.poll() is None:
            if Path(stop_file).exists():
                process.send_signal(signal.SIGINT)
                try:
                    return process.wait(STOP_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    process.kill()
            time.sleep(POLL_SECONDS)
        return process.wait()


class SlurmTrial:
    """A trial as a SLURM job; the same interface as trials.TrialProcess."""

    def __init__(self, executor: submitit.Executor, command: list[str], env: dict[str, str], log: Path) -> None:
        self.stop_file = log.parent / "stop"
        self.stop_file.unlink(missing_ok=True)  # left by the stop of this folder's earlier trial, continued now
        self.job = executor.submit(run_and_watch, command, env, str(log), str(self.stop_file), os.getcwd())

    def wait(self, seconds: float) -> int | None:
        time.sleep(seconds)
        if not self.job.done():
            return None
        try:
            codes = self.job.results()  # one per task
        except Exception:  # the job itself failed (cancelled, out of time, node lost): its log says why
            return 1
        return max(codes, key=abs)

    def interrupt(self) -> None:
        self.stop_file.touch()

    def finish(self) -> None:
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 30
        while not self.job.done() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if not self.job.done():
            self.job.cancel(check=False)

    def stop(self) -> None:
        self.interrupt()
        self.finish()


def slurm_executor(settings: Settings, tasks: int, gpus: int) -> submitit.Executor:
    """Submits one job per trial: one node, `tasks` tasks, `gpus` GPUs, the study's SLURM settings; job files in
    slurm/."""
    if shutil.which("sbatch") is None:
        raise ConfigError("search.backend=slurm submits with sbatch, which is not here; use search.backend=local")
    try:  # (sbatch without a controller: submitit's traceback at the first trial, which stayed "running")
        answer = subprocess.run(["sinfo", "--noheader"], capture_output=True, text=True, timeout=60)
        said = answer.stderr.strip().splitlines() or [f"sinfo exited {answer.returncode}"]
        problem = said[-1] if answer.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as error:
        problem = str(error)
    if problem:
        raise ConfigError(f"search.backend=slurm: SLURM does not answer here ({problem}); use search.backend=local")
    executor = submitit.SlurmExecutor(folder=settings.study_dir / "slurm" / "%j")
    options = {"partition": settings.slurm_partition} if settings.slurm_partition else {}
    if gpus:
        options["gpus_per_node"] = gpus
    executor.update_parameters(nodes=1, ntasks_per_node=tasks, time=settings.slurm_timeout_min, **options)
    return executor


def gpus_per_trial(settings: Settings, accelerator: str, devices: int | None) -> int:
    """GPUs a trial's job asks for: search.slurm_gpus_per_trial if given; else, for a training on GPUs
    (trainer.accelerator gpu, or auto on a cluster with GPUs), its devices (trainer.devices; 1 for auto); else 0."""
    if settings.slurm_gpus_per_trial is not None:
        return settings.slurm_gpus_per_trial
    if accelerator not in ("auto", "gpu", "cuda"):
        return 0
    has_gpus = cluster_has_gpus(settings.slurm_partition)
    if accelerator != "auto" and not has_gpus:
        where = f"partition {settings.slurm_partition}" if settings.slurm_partition else "the default partition"
        raise ConfigError(
            f"trainer.accelerator={accelerator}, but SLURM lists no GPUs in {where} (sinfo --format=%G); "
            "if its nodes have GPUs all the same, give search.slurm_gpus_per_trial=N"
        )
    return (devices or 1) if has_gpus else 0


def cluster_has_gpus(partition: str | None) -> bool:
    """Whether SLURM lists GPUs among the generic resources of the partition's nodes (sinfo's %G: gpu:4, gpu:a100:8,
    or (null)). Without sinfo, or if it fails: no."""
    command = ["sinfo", "--noheader", "--format=%G", *(["--partition", partition] if partition else [])]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(resource.startswith("gpu") for line in listed.split() for resource in line.split(","))
