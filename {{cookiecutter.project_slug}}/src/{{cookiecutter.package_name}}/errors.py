"""What every layer may raise, and how the commands report it: one line on stderr and an exit code.

A predictable mistake (bad input) is a ConfigError: exit 2, and a run folder that holds nothing is removed. A
training that stopped itself for a reason it can name, or a process that crashed, exits 1 keeping what it wrote.
"""

import difflib
import hashlib
import importlib
import json
import os
import pydoc
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from . import STARTED_BY

EXIT_REFUSED = 2  # a predictable mistake: nothing was trained
EXIT_STOPPED = 1  # a crash, or a training that stopped itself: its checkpoints are kept
EXIT_INTERRUPTED = 130  # Ctrl-C: stopped with a checkpoint, to be continued (as shells count SIGINT: 128 + 2)


class ConfigError(ValueError):
    """A setting that cannot work. train.py prints it as one line and exits before training."""


class TooFewProcesses(ConfigError):
    """A preset of several processes started as one: `what` it needs, then how to start more (`hint`), which
    depends on who starts them (the search and the bench start a trial's itself: trainer.devices)."""

    def __init__(self, what: str, hint: str = "") -> None:
        super().__init__(f"{what}: {hint}" if hint else what)
        self.what = what


class ProcessCrashed(RuntimeError):
    """A training process that this command started (strategy=ddp_spawn) crashed: a bug, not bad input. Its
    traceback is in the output already; the message names the process and the exception in one line."""

    def __init__(self, rank: int, traceback: str) -> None:
        lines = traceback.strip().splitlines()
        super().__init__(f"training process {rank} failed: {lines[-1] if lines else 'no message'} (traceback above)")


# The first words of the line a training stopped for a NaN or infinite loss ends with (runtime/metrics.py): the
# search records such a trial as pruned, its parameters' result, not a crash to retry
DIVERGED = re.compile(r"error: (train|val)/loss is (nan|inf|-inf) ")


class TrainingStopped(RuntimeError):
    """The training stopped itself for a reason it can name (e.g. out-of-memory errors that keep coming): train.py
    prints it as one line and exits 1, keeping what the run wrote (its checkpoints)."""


class Interrupted(TrainingStopped):
    """Ctrl-C: the training saved a checkpoint at a step's end and stopped; the message says how to continue.
    `code`: the exit code; 0 for the other processes Lightning started itself, whose launcher takes any other code of
    one of them for a crash and kills the first process before it has said how to continue (seen under load)."""

    def __init__(self, message: str = "", code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message)
        self.code = code


def spawned_failure(rank: int, traceback: str, config_errors: tuple[type, ...] = ()) -> Exception:
    """What a process this command spawned (strategy=ddp_spawn) died of, from its traceback's text, as this command
    reports it: a stop or a refusal (TrainingStopped, ConfigError or one of `config_errors`) as the one line it
    would be without the spawn; anything else, a bug, as ProcessCrashed, after printing the traceback."""
    lines = traceback.strip().splitlines()
    name, _, message = (lines[-1] if lines else "").partition(": ")  # "package.module.Class: message"
    raised = pydoc.locate(name) if name.replace(".", "").replace("_", "").isalnum() else None
    if isinstance(raised, type) and issubclass(raised, Interrupted):
        return Interrupted(message)
    if isinstance(raised, type) and issubclass(raised, TrainingStopped):
        return TrainingStopped(message)
    if isinstance(raised, type) and issubclass(raised, (ConfigError, *config_errors)):
        return ConfigError(message)
    print(traceback, file=sys.stderr)
    return ProcessCrashed(rank, traceback)


# DDP's reducer, at the forward after a step in which a parameter got no gradient (torch's words; Lightning replaces
# them by its own, which name a strategy this template does not have).
UNUSED_PARAMETERS = ("Expected to have finished reduction in the prior iteration", "parameters that were not used in")


def unused_parameters(
    message: str, preset: str, names: list[str] | None = None, unused: list[str] | None = None
) -> ConfigError | None:
    """The one-line refusal for DDP's error about parameters a step did not use (an auxiliary head, a branch taken
    some steps only), from its message or a spawned process's traceback; None for any other error. `names`: the
    net's trainable parameters in order, to name those torch lists by index; `unused`: their names, where the
    message does not list them."""
    if not any(words in message for words in UNUSED_PARAMETERS):
        return None
    listed = re.search(r"did not receive grad for rank \d+: ([\d ]+)", message)
    indices = [int(index) for index in listed.group(1).split()] if listed else []
    named = unused or [names[index] if names and index < len(names) else f"#{index}" for index in indices]
    which = f" ({', '.join(named)})" if named else ""
    return ConfigError(
        f"strategy={preset}: parameters of the model got no gradient in a training step{which}; if the model leaves "
        "them out on purpose, set strategy.find_unused_parameters=true (DDP then looks for them every step, slower), "
        "else use or remove them"
    )


def said_once(error: ConfigError, first_process: bool) -> ConfigError:
    """A refusal every training process raises alike: the first process's says it, the others' are silent (fail()
    prints no empty message), so that the console shows it once."""
    return error if first_process else ConfigError("")


def not_importable(error: Exception) -> ConfigError | None:
    """The one-line ConfigError for Hydra's report of a `_target_` it cannot import (a typo, a package that is not
    installed or not on the Python path), which is several lines; None for any other error of instantiate."""
    first, _, rest = str(error).partition("\n")
    target = re.match(r"Error locating target '(.+?)'", first)
    if target is None:
        return None
    key = re.search(r"full_key: (\S+)", rest)
    cause = error
    while cause.__cause__ is not None:  # down to the import's own error, e.g. "No module named 'my_pkg'"
        cause = cause.__cause__
    why = missing_name(target.group(1)) or str(cause).splitlines()[0]
    return ConfigError(
        f"{key.group(1) + '.' if key else ''}_target_={target.group(1)} cannot be imported ({why}); give the full "
        "import path of a class whose package is installed or on PYTHONPATH"
    )


def missing_name(path: str) -> str | None:
    """What a dotted path lacks when its module imports but has no such name (a misspelt class: Hydra's words were
    "No module named 'my_pkg.MyDatset'; 'my_pkg' is not a package"), with the nearest name there; else None."""
    parts = path.split(".")
    if not all(parts):  # `os..path`, a trailing dot: Hydra's words say it
        return None
    for end in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:end])
        try:
            found = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # no such module: a shorter path may be one
                continue
            return None
        except Exception:  # noqa: BLE001 (the module's own error, which Hydra's message names)
            return None
        for at, attribute in enumerate(parts[end:], start=end):
            try:
                found = getattr(found, attribute)
            except AttributeError:
                near = difflib.get_close_matches(attribute, [n for n in dir(found) if not n.startswith("_")], n=1)
                where = ".".join(parts[:at])
                return f"{where} has no {attribute}" + (f"; did you mean {where}.{near[0]}?" if near else "")
            except Exception:  # noqa: BLE001 (a lazy module's own __getattr__ failing: Hydra's words say it)
                return None
        return None
    return None


def located(key: str, name: str, what: str) -> Any:
    """The object a dotted path (`module.name`) given as setting `key` names, or a one-line ConfigError saying it
    does not import and that the setting takes `what`. (Hydra's locator logs its failures on top of raising.)"""
    module, _, attribute = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as err:  # ValueError: no module part ("" is not a module)
        raise ConfigError(f"{key}={name} does not import ({err}): give {what} (its module on PYTHONPATH)") from None


# what OmegaConf raises for a ${...} or a ??? it cannot resolve (config.objects.unresolved says it in one line)
UNRESOLVED = (InterpolationResolutionError, MissingMandatoryValue)


def fail(error: Exception, run_dir: Path | None = None) -> None:
    """Report a predictable mistake in one line, remove the run folder if nothing was written, exit EXIT_REFUSED (2).
    A crashed process, or a training that stopped itself, exits EXIT_STOPPED (1) instead, keeping what the run wrote."""
    message = str(error) if isinstance(error, Interrupted) else f"error: {error}"
    close_progress_bars()
    if str(error):  # (the same refusal raised in every process is said by the first only: said_once)
        tell_launcher(message)
        if first_to_say(message):
            print(message, file=sys.stderr)
    if isinstance(error, Interrupted):  # the first process says how to continue; the others stop quietly
        sys.exit(error.code)
    if isinstance(error, ProcessCrashed | TrainingStopped):
        sys.exit(EXIT_STOPPED)
    if run_dir is not None:
        remove_if_empty(run_dir)
    sys.exit(EXIT_REFUSED)


def close_progress_bars() -> None:
    """Close the progress bars a training left open (a refusal from inside it): the line then ends before the
    error's, which was glued to the bar's."""
    from tqdm import tqdm  # (Lightning's bars and the Accelerate loop's)

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


# Where torchrun (accelerate launch too) asks each process it started to write why it failed: the agent's report of the
# failure shows it as the root cause instead of "To enable traceback see ...". Its folder is this attempt's, shared by
# the processes of this machine and removed by torchrun when it exits.
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"


def tell_launcher(message: str) -> None:
    """Write `message` where torchrun's failure report reads it (the format of torch's elastic ErrorHandler)."""
    if path := os.environ.get(ERROR_FILE):
        Path(path).write_text(json.dumps({"message": message, "timestamp": int(time.time())}))


def first_to_say(message: str) -> bool:
    """Whether this process is the one on this machine to say `message` under torchrun or srun (a refusal every
    process reaches before they can talk to each other): the console shows it once per machine, not once per
    process. A message only some processes have (a file missing on one node) is still said by each of them."""
    digest = hashlib.sha256(message.encode()).hexdigest()[:16]
    if path := os.environ.get(ERROR_FILE):
        said = Path(path).parents[1] / f"said-{digest}"
    elif srun_tasks() > 1:  # srun's tasks
        step = "-".join(os.environ.get(name, "") for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"))
        said = Path(tempfile.gettempdir()) / f"said-slurm-{step}-{digest}"
    else:
        return True
    try:
        said.touch(exist_ok=False)
    except FileExistsError:
        return False
    except OSError:  # an unexpected folder: better twice than never
        return True
    return True


def srun_tasks() -> int:
    """The tasks of the srun step that started this process as one of them (started_by_slurm_step); 1 otherwise."""
    return int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) if started_by_slurm_step() else 1


def started_by_slurm_step() -> bool:
    """Whether srun started this process as one of its step's tasks (its parent is SLURM's step daemon), not a
    command typed in a shell that srun started (`srun -n 4 --pty bash`: the shell's step's variables, one process),
    nor one a task's script or a search's trial started."""
    try:
        return Path(f"/proc/{STARTED_BY}/comm").read_text().strip() == "slurmstepd"
    except OSError:
        return False


def launch_folder() -> Path:
    """The folder the command was started from (with hydra.job.chdir=true the process works in the run folder)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.cwd if HydraConfig.initialized() else Path.cwd()).resolve()


def remove_if_empty(run_dir: Path) -> None:
    """Remove the run folder Hydra made for a run that wrote nothing, and the empty folders above it: a --multirun's
    folder too where it holds nothing but Hydra's multirun.yaml (a sweep refused, or checked with check_only)."""
    run_dir, cwd = run_dir.resolve(), launch_folder()
    while run_dir.is_dir() and [path.name for path in run_dir.iterdir()] in ([], ["multirun.yaml"]) and run_dir != cwd:
        (run_dir / "multirun.yaml").unlink(missing_ok=True)
        run_dir.rmdir()
        if cwd not in run_dir.parents:
            break  # outside the working directory: remove the run folder itself only
        run_dir = run_dir.parent
