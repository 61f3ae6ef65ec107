"""Ctrl-C during training: finish the optimizer step under way, save a checkpoint there, stop, and say how to
continue. Written here because neither engine does it: Lightning's Ctrl-C ends the run where it is, saving nothing,
and accelerate's loop is ours. A second Ctrl-C stops at once.

Several processes each get the signal (the terminal's, or the one torchrun passes on to each), not necessarily
during the same step: at each logged step (trainer.log_every_n_steps) they ask each other (one collective of a
flag, where the loss is read anyway) and stop together if any was asked, saving that step. strategy=ddp_spawn's
processes stop at once: the process that started them ends them.

SIGTERM is handled the same way when no launcher started the training (a `kill PID`); under torchrun, SLURM or
accelerate launch, SIGTERM is the launcher's (stopping the other workers after one died, a requeue) and keeps its
meaning: stop now.
"""

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError, Interrupted
from ..parallel.launcher import detect_launcher
from .checkpoint_files import saved_checkpoint
from .run_folder import HELD_BY_THE_COMMAND

FINISHED_FILE = "finished"  # in a run folder whose training ended normally: run_id=last does not continue it


class Interrupt:
    """Turns Ctrl-C into a request the training loop answers at the end of a step (`requested`)."""

    def __init__(self) -> None:
        self.requested = False
        self.previous: dict[int, object] = {}
        self.pid, self.announce, self.when = os.getpid(), True, "after this step"

    def install(self, processes: int = 1, announce: bool = True) -> None:
        """Answer Ctrl-C in this process, one of `processes`; `announce`: say so (the first process only)."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers live in the main thread only
        if multiprocessing.parent_process() is not None:  # strategy=ddp_spawn's: the process that started them
            return  # stops them at once, and says how to continue
        self.pid, self.announce = os.getpid(), announce
        if processes > 1:
            self.when = "every process at the next logged step (trainer.log_every_n_steps)"
        signals = [signal.SIGINT] if detect_launcher() else [signal.SIGINT, signal.SIGTERM]
        for signum in signals:
            self.previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if os.getpid() != self.pid:  # a data loader worker forked from the training: the training answers
            return
        if self.requested:  # the second one: stop now
            self.restore()
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:
            name = signal.Signals(signum).name
            print(
                f"\n{name}: stopping {self.when} with a checkpoint (again: stop at once)", file=sys.stderr, flush=True
            )


@contextmanager
def ctrl_c(processes: int = 1, announce: bool = True) -> Iterator[Interrupt]:
    """An Interrupt answering Ctrl-C while the block runs; the previous handlers afterwards."""
    interrupt = Interrupt()
    interrupt.install(processes, announce)
    try:
        yield interrupt
    finally:
        interrupt.restore()


def interrupted(step: int, checkpoint: Path | str, run_id: str) -> Interrupted:
    return Interrupted(f"interrupted after step {step}, saved in {checkpoint}: {how_to_continue(run_id)}")


@contextmanager
def stops_at_once(what: str) -> Iterator[None]:
    """Ctrl-C while `what` runs before the first training step (the batch-size search): stop at once in one line
    (exit 130), nothing being there to save; also where the process was started with SIGINT ignored (a background
    job), as the training's Ctrl-C is answered there too."""
    main = threading.current_thread() is threading.main_thread() and multiprocessing.parent_process() is None
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted during {what}, before the first step: nothing to continue; run the command "
                          "again to start over") from None  # fmt: skip
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (a `kill PID`, where no launcher started the training) outside the steps Interrupt answers, such as
    the start (restoring a checkpoint) and the test pass: a Ctrl-C, said in one line with how to continue. It ended
    the Accelerate engine's process without a word (exit 143), and Lightning's with exit 0, nothing trained."""
    main = threading.current_thread() is threading.main_thread() and multiprocessing.parent_process() is None
    if not main or detect_launcher():  # (a launcher's SIGTERM keeps its meaning: stop now)
        yield
        return
    previous = signal.signal(signal.SIGTERM, _as_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _as_keyboard_interrupt(signum: int, frame: object) -> None:
    if multiprocessing.parent_process() is None:  # (a loader worker forked with it: the training answers)
        raise KeyboardInterrupt


def how_to_continue(run_id: str) -> str:
    """The same command with its run id (the folder's name was a --multirun job's number, which started a new
    sweep); run_id=last finds single runs only."""
    if in_a_sweep():
        return f"continue with the same command plus run_id={run_id} (each job of the sweep from its last checkpoint)"
    if run_folder_given():  # (a search's trial: the search continues it so)
        return "continue with the same command (its hydra.run.dir holds the checkpoints)"
    return f"continue with the same command plus run_id={run_id} (or run_id=last)"


def continuing(run_id: str, run_dir: Path) -> str:
    """How to continue a training stopped from outside (Ctrl-C while it started, a process killed): from its last
    checkpoint, or, if it saved none yet, by starting over (it named a checkpoint that was not there, and run_id=last
    another run's)."""
    if not saved_checkpoint(run_dir):
        return "it saved no checkpoint to continue from; run the command again to start over"
    return f"{how_to_continue(run_id)}, from its last checkpoint"


def run_folder_given() -> bool:
    """Whether the command line names the run folder (hydra.run.dir=...), which the same command then finds again.
    (A process the command started itself, strategy=ddp trainer.devices=N, has the folder last on its line: the
    command's, not the user's.)"""
    from hydra.core.hydra_config import HydraConfig

    overrides = HydraConfig.get().overrides.hydra if HydraConfig.initialized() else []
    given = [override for override in overrides if override.startswith("hydra.run.dir=")]
    return len(given) > (1 if os.environ.get(HELD_BY_THE_COMMAND) else 0)


def in_a_sweep() -> bool:
    """Whether this training is one job of a --multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def mark_finished(run_dir: Path, finished: bool) -> None:
    """Record whether the training in `run_dir` ended normally (first process only)."""
    marker = Path(run_dir) / FINISHED_FILE
    if finished:
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


def ending_limit(run_dir: Path) -> str:
    """The setting that ended a finished run: trainer.max_steps where its config set one, else trainer.max_epochs."""
    from omegaconf import OmegaConf  # (a second to import: only for this refusal)

    saved = run_dir / "config.yaml"
    steps = OmegaConf.select(OmegaConf.load(saved), "trainer.max_steps") if saved.is_file() else None
    return "trainer.max_steps" if isinstance(steps, int) and steps > 0 else "trainer.max_epochs"


def continue_last(argv: list[str], experiment: str) -> list[str]:
    """The command line with `run_id=last` replaced by the id of `experiment`'s newest run (the config's, which a
    recipe of yours may set), if it has a checkpoint and did not finish (outputs/<experiment>/<run id>/, the default
    run folders). Raises ConfigError otherwise."""
    if "run_id=last" not in argv:
        return argv
    folder = Path("outputs") / experiment
    runs = [run for run in folder.glob("*") if (run / "checkpoints").is_dir()]
    if not runs:
        raise ConfigError(f"run_id=last: {folder}/ holds no run with a checkpoint to continue; leave run_id out")
    newest = max(runs, key=lambda run: (run / "checkpoints").stat().st_mtime)
    if (newest / FINISHED_FILE).exists():
        raise ConfigError(
            f"run_id=last: the newest run of experiment={experiment}, {newest.name}, finished; to train it further "
            f"give run_id={newest.name} (with more {ending_limit(newest)}), or leave run_id out for a new run"
        )
    print(f"run_id=last: continuing {newest}", file=sys.stderr)
    return [f"run_id={newest.name}" if arg == "run_id=last" else arg for arg in argv]
