"""A command's start (run_cli): Hydra runs it after the project's checks of its flags, presets, settings, seed and
run folder, each refused in one line with exit code 2."""

import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.hydra import Hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from ..errors import ConfigError, fail
from ..parallel.launcher import check_run_id
from ..runtime.interrupt import continue_last
from . import CONFIG_DIR
from .groups import check_group_choices, presets_of, sweep_values, training_groups, without_logger
from .overrides import check_overrides, checked_when_hydra_composes, primary_config
from .settings import leaves


def run_cli(run: Callable[[], None], config_name: str = "train") -> None:
    """The command line: an unknown config group choice or setting, a value of the wrong type, or a multi-node
    launch without a run id, is refused in one line; run_id=last becomes the id of the run to continue; then Hydra
    runs `run`."""
    notes_in_one_line()
    try:
        check_flags(sys.argv[1:], config_name)
        sys.argv[1:] = without_logger(sys.argv[1:])
        check_group_choices(sys.argv[1:])
        deferred = check_overrides(sys.argv[1:], config_name, defer=True)
        check_run_id(sys.argv[1:])
        check_output_folder(sys.argv[1:])
        check_seed_and_names(sys.argv[1:])
        if "run_id=last" in sys.argv[1:]:
            sys.argv[1:] = continue_last(sys.argv[1:], composed_experiment(sys.argv[1:], config_name))
    except ConfigError as err:
        fail(err)
    skip_the_hydra_mode_probe(sys.argv[1:])
    with checked_when_hydra_composes(deferred):
        run()


def composed_experiment(args: list[str], config_name: str) -> str:
    """The experiment these overrides train: the command line's last `experiment=`, or what the config makes of
    them (a recipe of yours, +recipe=NAME, may set it: run_id=last looked in outputs/default/ and continued, or
    began, another run)."""
    try:
        rest, folder, name, added = primary_config(args, config_name)  # (a search's best.yaml names its study)
        overrides = [arg for arg in rest if "=" in arg and not arg.startswith("-") and arg != "run_id=last"]
        searched = [f"hydra.searchpath=[{', '.join(f'file://{path}' for path in added)}]"] if added else []
        with initialize_config_dir(str(folder), version_base="1.3"):
            return str(compose(name, overrides=[*searched, *overrides]).experiment)
    except Exception:  # noqa: BLE001 (a config that does not compose: the training refuses it, in its words)
        return next((arg.partition("=")[2] for arg in reversed(args) if arg.startswith("experiment=")), "default")


# Hydra's options that name another config (a search's best.yaml: --config-dir ... --config-name best), the long
# ones as argparse takes them, abbreviated too
OTHER_CONFIG = ("-cp", "-cn", "-cd", "--con")


def skip_the_hydra_mode_probe(args: list[str]) -> None:
    """Before composing the config to run a command, Hydra composes all of it once more only to read `hydra.mode`
    (hydra/_internal/utils.py, _run_hydra); it has no option to skip that. This project's configs leave hydra.mode
    unset (the probe's answer is None: --multirun decides), so where the command line neither sets it nor names
    another config, the probe answers None at once: ~0.1 s of CPU less at each process's start (every rank, every
    search trial)."""
    if any("hydra.mode" in arg or arg.partition("=")[0].startswith(OTHER_CONFIG) for arg in args):
        return
    Hydra.get_mode = lambda self, config_name, overrides: None


# Hydra's own options (with their values where they take one); anything else with a dash is a habit of other tools.
HYDRA_FLAGS = {
    "-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p", "--package", "-r", "--run",
    "-m", "--multirun", "-sc", "--shell-completion", "-cp", "--config-path", "-cn", "--config-name", "-cd",
    "--config-dir", "--experimental-rerun", "-i", "--info",
}  # fmt: skip


# Where a command's own settings live, for the hint (`--max-epochs 2`: trainer.max_epochs=2; the bench's
# `--steps 5`: bench.steps=5, its `--max-epochs 2`: trainer.max_epochs=2, the trainings it runs).
SETTINGS_NODE = {"train": "trainer", "doctor": "doctor", "bench": "bench"}


def flag_key(name: str, config_name: str) -> str | None:
    """The key a `--name` most likely meant: the command's own setting, a preset group or top-level setting
    (strategy, seed), the trainer's, else the one setting of that name anywhere (batch_size: data.batch_size; lr:
    model.optimizer.lr), or the one group or top-level setting it begins (exp: experiment); None if none."""
    node = SETTINGS_NODE.get(config_name, config_name)
    if name in OmegaConf.load(CONFIG_DIR / f"{config_name}.yaml").get(node, {}):
        return f"{node}.{name}"
    top = [*sorted(training_groups()), *OmegaConf.load(CONFIG_DIR / "train.yaml")]
    top.remove("defaults")  # (Hydra's list of the groups, not a setting)
    if name in top:
        return name
    if name in OmegaConf.load(CONFIG_DIR / "trainer" / "default.yaml"):
        return f"trainer.{name}"
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            keys = [key for key, value in leaves(compose(config_name)) if not isinstance(value, dict)]  # values
    except Exception:  # noqa: BLE001 (only a hint: a config that does not compose is refused later, in its words)
        keys = []
    named = [key for key in keys if key.rpartition(".")[2] == name]
    begun = [key for key in dict.fromkeys(top) if len(name) > 2 and key.startswith(name)]
    return named[0] if len(named) == 1 else begun[0] if len(begun) == 1 else None


# Hydra's options that take the next argument as their value (`--config-name best`, `--cfg job`).
HYDRA_VALUED = {"-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd",
                "--config-dir", "--experimental-rerun", "-i", "--info", "-sc", "--shell-completion"}  # fmt: skip


def check_flags(args: list[str], config_name: str) -> None:
    """Refuse `--devices 2` (argparse's habit) in one line naming the key=value form; Hydra printed its usage, eight
    lines ending in "unrecognized arguments". A bare word (`ddp`; the bench's `scaling memory`) too: Hydra's was four
    lines ("missing EQUAL"), exit 1."""
    previous = ""
    for arg in args:
        if "=" not in arg and not arg.startswith(("-", "~", "+")) and not _takes_value(previous):  # (~key: removal)
            group = next((name for name in sorted(training_groups()) if arg in presets_of(name)), None)
            raise ConfigError(
                f"{arg} is not a setting: this command takes key=value" + (f", e.g. {group}={arg}" if group else "")
            )
        previous = arg
        flag = arg.partition("=")[0]
        if arg.startswith("-") and not _hydra_flag(flag) and not arg.lstrip("-")[:1].isdigit():
            raise not_an_option(flag, flag_key(flag.lstrip("-").replace("-", "_"), config_name))


def not_an_option(flag: str, key: str | None) -> ConfigError:
    """`--flag` refused, naming the key=value it most likely meant (`key`) if any."""
    return ConfigError(
        f"{flag} is not an option of this command: its settings are key=value"
        + (f", e.g. {key}=..." if key else "")
        + " (--help lists them)"
    )


def _takes_value(flag: str) -> bool:
    """One of Hydra's options that takes the next argument as its value, abbreviated too (--config-n best)."""
    if flag.startswith("--") and len(flag) > 2:
        return any(known.startswith(flag) for known in HYDRA_VALUED if known.startswith("--"))
    return flag in HYDRA_VALUED


def _hydra_flag(flag: str) -> bool:
    """One of Hydra's options as argparse takes them: a long one abbreviated (--multi), a short one with its value
    attached (-cjob)."""
    if flag == "--experimental-rerun":  # whole only: --experiment=x meant experiment=x
        return True
    if flag.startswith("--"):
        return any(known.startswith(flag) for known in HYDRA_FLAGS - {"--experimental-rerun"} if known.startswith("--"))
    return any(flag.startswith(known) for known in HYDRA_FLAGS if not known.startswith("--"))


def notes_in_one_line() -> None:
    """Show this project's own warnings (a preset that falls back to one device, say) as one `note:` line, as its other
    notes are, not as Python's file, line and source line; other libraries' warnings as they are."""
    package, shown = str(CONFIG_DIR.parent), warnings.formatwarning

    def note(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
        if str(filename).startswith(package):
            return f"note: {message}\n"
        return shown(message, category, filename, lineno, line)

    warnings.formatwarning = note


def check_seed_and_names(overrides: list[str]) -> None:
    """Refuse a seed torch and numpy do not take (a traceback after the run folder was made; one read from elsewhere,
    `seed=${oc.decode:${oc.env:SEED}}`, is taken as it resolves), a run name that
    leaves outputs/<experiment>/ (run_id=../x wrote beside the project's outputs) and a wandb project wandb refuses
    (a traceback after the run folder was made) or left empty (an unset variable: `logger.project=$PROJECT`)."""
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key == "logger.project":
            check_wandb_project(value)
        if key == "logger.mode" and value not in WANDB_MODES and "${" not in value:  # (wandb's traceback, once started)
            raise ConfigError(f"logger.mode={value} is not a wandb mode; valid: {', '.join(WANDB_MODES)}")
        for given in sweep_values(override, [value]) if key in (*SEEDS, "run_id", "experiment") else []:
            if key in SEEDS and "${" not in given and not (given.isdigit() and int(given) < 2**32):
                default = " (the default is 42)" if key == "seed" else ""
                raise ConfigError(f"{key}={given} must be a whole number from 0 to {2**32 - 1}{default}")
            if key not in SEEDS and ("/" in given or given in ("", ".", "..") or _parsed(override) in (None, "")):
                raise ConfigError(
                    f"{key}={given} must name one folder (outputs/<experiment>/<run_id>): no / or .., not empty or "
                    "null (leave it out for the default)"
                )


SEEDS = ("seed", "data.seed", "data.dataset.seed")  # (data.seed: ${seed}, whose type nothing else checks)
WANDB_MODES = ("online", "offline", "disabled", "shared")  # wandb.init's (its Settings take these)


def check_wandb_project(name: str) -> None:
    """wandb's own rule for project names (checked by its Settings; imported only when a project is given)."""
    if name in ("", "null", "''", '""'):
        raise ConfigError("logger.project is empty: give a wandb project name, or leave it out for the default")
    from wandb.errors import UsageError
    from wandb.sdk.wandb_settings import Settings

    try:
        Settings(project=name)
    except UsageError as error:
        raise ConfigError(
            f"logger.project={name}: {str(error).partition(': ')[2]} (wandb's rule for project names)"
        ) from None


def _parsed(override: str) -> Any:
    """The value Hydra makes of `key=value` (`''`: the empty text, `null`: None); the text where Hydra cannot parse
    it (it then refuses the line itself) or for a sweep."""
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        return override.partition("=")[2]
    return override.partition("=")[2] if parsed.is_sweep_override() else parsed.value()


def check_output_folder(overrides: list[str]) -> None:
    """Refuse, in one line, a run folder that cannot be made (Hydra would fail making it, with its traceback): the
    nearest folder of the path that exists is a file, or cannot be written (a read-only mount)."""
    given = next(
        (
            override_value(item)
            for item in reversed(overrides)
            if item.startswith(("hydra.run.dir=", "hydra.sweep.dir="))
        ),
        "outputs",
    )
    folder = Path(given)
    existing = next(path for path in [folder, *folder.parents] if path.exists() or path == Path(path.anchor or "."))
    if not existing.is_dir():
        raise ConfigError(f"the run folder {given} cannot be made: {existing} is a file; give hydra.run.dir=FOLDER")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"the run folder {given} cannot be made: {existing} cannot be written (read-only); give "
            "hydra.run.dir=FOLDER somewhere writable, or run from such a folder"
        )


def override_value(override: str) -> str:
    """The value of `key=value` as Hydra reads it: a quoted one without its quotes (hydra.run.dir="my runs", and
    Lightning's other processes are given it quoted), else as given."""
    try:
        return str(OverridesParser.create().parse_override(override).value())
    except HydraException:
        return override.partition("=")[2]
