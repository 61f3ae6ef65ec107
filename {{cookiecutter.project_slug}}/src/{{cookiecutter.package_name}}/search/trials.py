"""Running one trial: a full training in its own process tree and run folder, started the way its preset is
started, on the devices it was given, reporting each epoch's validation metric to Optuna and stopped when the
pruner says so."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import optuna
from omegaconf import DictConfig

from ..config.objects import unresolved
from ..errors import DIVERGED, EXIT_REFUSED, UNRESOLVED, ConfigError
from ..tracking.epoch_metrics import read_epoch_metrics

GUARD = f"{__package__}.guard"  # search/guard.py
POLL_SECONDS = 0.2  # how often a running trial's metrics file is read
STOP_GRACE_SECONDS = 60  # how long a stopped trial may take to close its wandb run before it is killed


class TrialFailed(RuntimeError):
    """A trial's training exited with an error or reported nothing; Optuna records it as failed. The message is
    one line: the trial, the training's error, its log."""


class MetricMissing(ConfigError):
    """The training does not report search.metric: every trial would fail the same way, so the search stops."""


def check_training(cfg: DictConfig, preset: str, processes: int, env: dict[str, str]) -> None:
    """Run the training's own checks on the first trial's config (composed with its Hydra config) as its trial
    will start, with the environment `env` gives it: a config that the training refuses is refused before the
    first trial, not once per trial. Raises ConfigError."""
    from hydra.core.hydra_config import HydraConfig

    from ..engine.launching import check_trial  # torch and the engine: only now, they take seconds to import

    HydraConfig.instance().set_config(cfg)  # the training reads its preset and command line from there
    saved = dict(os.environ)
    os.environ.update(env)  # e.g. CUDA_VISIBLE_DEVICES: the devices the trial will see
    try:
        with warnings.catch_warnings():  # about a training that is not run (each trial's log has its own)
            warnings.simplefilter("ignore")
            check_trial(cfg, preset, processes)
    except UNRESOLVED as err:  # a resolver's ConfigError (e.g. data=files checking its files), or a ??? left unset
        raise ConfigError(f"the training refuses the first trial's config: {unresolved(err)}") from None
    except ConfigError as err:
        raise ConfigError(f"the training refuses the first trial's config: {err}") from None
    except Exception:  # a crash (a bug, or this sample's values only) is left to the trials, which log it
        pass
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_some_trial(
    first: DictConfig, others: Iterable[DictConfig], preset: str, processes: int, env: dict[str, str]
) -> None:
    """check_training on the first trial's config; where the training refuses it, on `others` (a parameter at another
    of its values) too: the search stops only where each is refused. A value that some trials get (3 attention heads
    over 2 tensor-parallel ranks, say) fails those trials alone, and is said once here."""
    try:
        check_training(first, preset, processes, env)
    except ConfigError as refused:
        for config in others:
            try:
                check_training(config, preset, processes, env)
            except ConfigError:
                continue
            reason = str(refused).removeprefix("the training refuses the first trial's config: ")
            print(f"note: the training refuses some trials' configs ({reason}): those trials fail", file=sys.stderr)
            return
        raise


def local_devices(n_jobs: int, per_trial: int | None, cpu: bool) -> list[dict[str, str]]:
    """The environment of each of n_jobs concurrent trials: disjoint sets of GPUs (CUDA_VISIBLE_DEVICES); on
    the CPU, an even share of the cores (OMP_NUM_THREADS), since every process would otherwise take them all."""
    gpus = [] if cpu else visible_gpus()
    if not gpus:
        threads = max(1, (os.cpu_count() or 1) // (n_jobs * (per_trial or 1)))
        return [{"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}] * n_jobs
    per_trial = per_trial or len(gpus) // n_jobs
    if per_trial < 1 or per_trial * n_jobs > len(gpus):
        raise ConfigError(
            f"search.n_jobs={n_jobs} trials of {per_trial} GPUs each need {n_jobs * per_trial} GPUs; "
            f"{len(gpus)} are visible"
        )
    sets = [gpus[i * per_trial : (i + 1) * per_trial] for i in range(n_jobs)]
    return [{"CUDA_VISIBLE_DEVICES": ",".join(gpu_set)} for gpu_set in sets]


class DeviceSlots:
    """One slot per concurrent trial; a trial holds its slot (its devices) while it runs."""

    def __init__(self, slots: list[dict[str, str]]) -> None:
        self.first = slots[0]  # the first trial's
        self.free: queue.Queue[dict[str, str]] = queue.Queue()
        for slot in slots:
            self.free.put(slot)

    @contextmanager
    def take(self) -> Iterator[dict[str, str]]:
        slot = self.free.get()
        try:
            yield slot
        finally:
            self.free.put(slot)


def visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu for gpu in visible.split(",") if gpu.strip()]
    import torch  # only here: the search itself never touches a GPU

    return [str(index) for index in range(torch.cuda.device_count())]


class Trial(Protocol):
    """A trial's training, started: as a local process tree (TrialProcess) or a SLURM job (slurm.SlurmTrial)."""

    def wait(self, seconds: float) -> int | None: ...  # the exit code, or None while it runs
    def interrupt(self) -> None: ...  # ask it to stop (Ctrl-C): it closes its wandb run
    def finish(self) -> None: ...  # wait for it to end; kill what is left after STOP_GRACE_SECONDS


StartTrial = Callable[[list[str], dict[str, str], Path], Trial]  # (command, extra environment, log file)
RUNNING: set[Trial] = set()  # the trials running now, to stop them all when the search is stopped
RUNNING_LOCK = threading.Lock()
STOPPING = threading.Event()  # the search is stopping (Ctrl-C, SIGTERM): no trial's end is recorded any more


def stop_all() -> None:
    with RUNNING_LOCK:
        trials = list(RUNNING)
    for trial in trials:
        trial.interrupt()
    for trial in trials:
        trial.finish()


class TrialProcess:
    """A trial's training as a local process tree."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, inherit: tuple[int, ...] = ()) -> None:
        """`inherit`: open files the training keeps while it runs (the study's lock)."""
        guarded = [sys.executable, "-m", GUARD, str(os.getpid()), *command]  # ends with the search, however it ends
        with open(log, "a") as output:  # (a trial continued in its folder: after the log of its start)
            # Its own session: Ctrl-C in the terminal reaches the search only, which stops the trial itself.
            self.process = subprocess.Popen(
                guarded,
                env={**os.environ, **env},
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=inherit,
            )

    def wait(self, seconds: float) -> int | None:
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            return None

    def interrupt(self) -> None:
        """Ctrl-C to the training (its launcher passes it on): the training unwinds and closes its wandb run."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def finish(self) -> None:
        """Wait for the training to end; kill whatever is left after the grace period (a launcher's workers too)."""
        self.wait(STOP_GRACE_SECONDS)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the whole tree has ended
        self.process.wait()


def run_trial(
    trial: optuna.Trial, start: StartTrial, command: list[str], env: dict[str, str], run_dir: Path, metric: str
) -> float:
    """Train, report `metric` after every epoch, stop early if the pruner says so; the last epoch's value."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log, metrics_file = run_dir / "train.log", run_dir / "epochs.jsonl"
    trial.set_user_attr("log", str(log))
    process = start(command, env, log)
    with RUNNING_LOCK:
        RUNNING.add(process)
    reported: list[dict[str, float]] = []  # the metrics file's lines so far
    epochs: set[int] = set()  # the epochs reported to Optuna
    try:
        while True:
            code = process.wait(POLL_SECONDS)
            for epoch in read_epoch_metrics(metrics_file)[len(reported) :]:
                reported.append(epoch)
                if metric not in epoch:
                    names = ", ".join(name for name in epoch if name not in ("epoch", "final"))
                    raise MetricMissing(f"search.metric={metric} is not reported; the first epoch reported {names}")
                if int(epoch["epoch"]) in epochs:  # validated again in the epoch (Lightning's val_check_interval),
                    continue  # or by a continued trial from a checkpoint of before its end: Optuna takes one per step
                epochs.add(int(epoch["epoch"]))
                trial.report(epoch[metric], step=int(epoch["epoch"]) + 1)  # epochs trained: Hyperband's resource
                if not epoch.get("final") and trial.should_prune():  # (at the final one, the result is there)
                    pruned = f"epoch {int(epoch['epoch'])}: {metric}={epoch[metric]:.4g}"
                    with open(log, "a") as output:  # before the training's own words about its Ctrl-C
                        output.write(f"search: trial {trial.number} pruned after {pruned}; it stops here\n")
                    raise optuna.TrialPruned(pruned)
            if code is not None:
                break
    finally:
        process.interrupt()  # nothing if it has ended
        process.finish()  # also ends the processes it may have left behind
        with RUNNING_LOCK:
            RUNNING.discard(process)
    if STOPPING.is_set():  # under n_jobs > 1 this thread would record the stopped trial as failed, its parameters
        threading.Event().wait()  # lost; the search ends the process (os._exit) and the next one runs it again
    if code == EXIT_REFUSED:  # its parameters: a grid does not queue the point again (it did, until 3 in a row)
        trial.set_user_attr("refused", True)
        why = f"exit code {code}: the training refused its parameters"
        raise TrialFailed(f"trial {trial.number} failed ({why}): {last_error(log)}; log: {log}")
    if code != 0 and DIVERGED.match(error := last_error(log)):  # a grid queued the point again, 3 times in a row
        with open(log, "a") as output:
            output.write(f"search: trial {trial.number} diverged; recorded as pruned\n")
        raise optuna.TrialPruned(f"diverged: {error.removeprefix('error: ')}")
    if code != 0:
        raise TrialFailed(f"trial {trial.number} failed (exit code {code}): {last_error(log)}; log: {log}")
    if not reported:  # every trial would end so: the search stops (it went on until 3 had failed in a row)
        raise MetricMissing(
            f"trial {trial.number} trained to its end without a validation, so without {metric} (validation runs "
            "at each epoch's end and where trainer.max_steps stops it, unless turned off: trainer.limit_val_batches=0)"
        )
    return reported[-1][metric]


# A line that states an error: the training's one-line refusal, a traceback's last line (Type: message), or the
# exception Hydra reports for an object it could not build (Type('message')).
ERROR_LINE = re.compile(r"error: .+|[\w.]*(Error|Exception)\w*(: .+|\(.+\))")
ESCAPE_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a terminal's: colours, cursor moves (tqdm's \x1b[A)


def last_error(log: Path) -> str:
    """The last error line of a training's log (under a launcher, a process's error comes before the launcher's
    own report, which names no cause)."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    # (splitlines parts a progress bar's redraws at their carriage returns; an error printed after a bar follows
    # the bar's cursor moves, \x1b[A, on its line)
    lines = [ESCAPE_CODE.sub("", line).strip() for line in lines]
    errors = [line for line in lines if ERROR_LINE.fullmatch(line)]
    return errors[-1] if errors else "no error line in its log"
