"""Hydra glue shared by every command: the config folder, the command-line pre-checks, the resolvers the YAML
files use and building objects from configs with one-line errors."""

import contextlib
import difflib
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override, OverrideType
from hydra.errors import HydraException, InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError

from .data.files import resolve as data_files
from .data.streaming_shapes import streamed_shapes
from .errors import ConfigError, fail, not_importable
from .parallel.launcher import check_run_id, default_run_id
from .runtime.interrupt import continue_last
from .runtime.metrics import best_mode
from .tracking.wandb_run import wandb_mode

CONFIG_DIR = Path(__file__).parent / "configs"


def check_group_choices(overrides: list[str]) -> None:
    """Reject `strategy=typo` (or any config group) in one line that lists the valid choices; each value of a
    --multirun sweep (`strategy=single,ddp`, `choice(...)`) too.

    Hydra would reject it too, but with a multi-line report of its search path. Extra config folders
    (--config-dir, hydra.searchpath) can add choices, so then Hydra alone checks.
    """
    if any(arg.startswith(("--config-dir", "-cd", "hydra.searchpath")) for arg in overrides):
        return
    for override in overrides:
        group, has_value, choice = override.lstrip("+").partition("=")
        if has_value and (CONFIG_DIR / group).is_dir() and group not in training_groups():  # Hydra: 4 lines
            _check_other_group(group, choice, override.startswith("+"))
        if has_value and (CONFIG_DIR / group).is_dir():
            choices = _choices(group)
        elif has_value and group.startswith("hydra/"):  # Hydra's own groups (hydra/launcher=...), its plugins' too
            choices = hydra_group_options(group)
        else:
            continue
        for value in _sweep_values(override, [choice]):
            if value not in choices:
                toolkit = group == "callbacks" and value in OOM_TOOLKIT_PARTS
                moved = "; the OOM toolkit is oom=toolkit (configs/oom/)" if toolkit else ""
                raise ConfigError(f"unknown {group} {value!r}; valid: {', '.join(choices) or 'none'}{moved}")


def hydra_group_options(group: str) -> list[str]:
    """The choices of one of Hydra's config groups, with the plugins installed (Hydra's refusal is ten lines)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins

    Plugins.instance()  # imports the installed plugins, which register their choices
    if GlobalHydra.instance().is_initialized():  # (inside a command Hydra runs: the search's trials)
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


def _check_other_group(group: str, choice: str, added: bool) -> None:
    """A config folder outside the training's defaults: another command's presets (search/), or a folder of presets
    of your own (`# @package _global_` files, as lightning-hydra-template's experiment/), which +GROUP=NAME adds."""
    package, module = CONFIG_DIR.parent, CONFIG_DIR.parent / f"{group}.py"  # a command: python -m package.group
    if (package / group / "__main__.py").is_file() or (module.is_file() and "\ndef main(" in module.read_text()):
        raise ConfigError(
            f"{group}={choice}: the {group} presets are for `python -m {__package__}.{group}`, not this command"
        )
    if group == "experiment":  # a group of that name hides the run's name, experiment=NAME
        raise ConfigError(
            "configs/experiment/ makes `experiment` a config group, which hides the run's name (experiment=NAME): "
            f"name the folder of your presets otherwise, e.g. configs/recipe/{choice}.yaml chosen with +recipe={choice}"
        )
    if not added:
        raise ConfigError(
            f"{group}={choice}: configs/{group}/ is not in the training's defaults list (configs/train.yaml); add the "
            f"preset with +{group}={choice}"
        )


def _sweep_values(override: str, single: list[str]) -> list[str]:
    """The values of a --multirun sweep (`a,b`, `choice(a,b)`, `range(1,4)`) or of a list (`callbacks=[a,b]`) as
    text; `single` for one value; none for a sweep that lists no values (`interval(...)`, `glob(...)`)."""
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        return single
    if not parsed.is_sweep_override():
        value = parsed.value()
        return [str(item) for item in value] if isinstance(value, list) else single
    try:
        return list(parsed.sweep_string_iterator())
    except (HydraException, TypeError, ValueError, AttributeError):
        return []


def training_groups() -> set[str]:
    """The config groups of the training's config (train.yaml's defaults list; the doctor and bench start from it)."""
    defaults = OmegaConf.load(CONFIG_DIR / "train.yaml").defaults
    return {next(iter(entry)) for entry in defaults if isinstance(entry, DictConfig)} - {"override hydra/job_logging"}


# Settings whose default is a number but which also take text (Lightning's devices: "auto", "0,1").
TEXT_ALSO = {"trainer.devices", "data.num_workers"}  # a number, or auto


MULTIRUN = ("-m", "--multirun")


def check_overrides(overrides: list[str], config_name: str, defer: bool = False) -> Callable[[DictConfig], None] | None:
    """Refuse, before Hydra makes a run folder, a `key=value` whose key the config lacks (naming the nearest key)
    or whose value is not a number or true/false where the default is one (`model.optimizer.lr=abc`, `=[1,2]`);
    a `+key=...` of a key that is there, a `~key` of one that is not, or of settings the training reads. Each value
    of a --multirun sweep too (`trainer.max_epoch=1,2`: Hydra left a multirun folder behind).

    Hydra checks keys too, but after several lines of its own, with no suggestion; it does not check types at all
    (the YAML files are untyped), so `lr=abc` reached the optimizer after a wandb run was created. It needs the
    config with the command line's presets but not its settings: one compose (~0.1 s of CPU; a second with all of
    it where a key is added or removed), only when a key is set. `defer`: where every setting is a plain
    `key=value` of the command's own config, return the check instead, for the config Hydra composes to run
    (checked_when_hydra_composes: that compose, not one more).
    """
    args = [arg for arg in overrides if arg not in MULTIRUN]
    args, config_dir, config_name = _primary_config(args, config_name)  # (best.yaml of a search: --config-dir ...)
    if any(arg.startswith("-") for arg in args):  # --cfg, --help ...: Hydra's to check
        return None
    extra = [f"hydra.searchpath=[file://{CONFIG_DIR}]"] if config_dir != CONFIG_DIR else []  # (its `train`)
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException:
        return None  # Hydra reports a line it cannot parse in one line of its own
    settings = [o for o in parsed if _is_key(o) and not o.key_or_group.startswith("hydra")]
    groups = training_groups()
    for override in parsed:
        group = override.key_or_group
        if not _is_key(override) and override.type == OverrideType.DEL:
            raise ConfigError(f"~{group}: {_not_removable(group, groups)}")
        if not _is_key(override) and override.type == OverrideType.ADD and group in groups and not override.package:
            raise ConfigError(f"+{group}: a preset of {group} is chosen already; choose another without +: {group}=...")
    if not settings:
        return None

    def check(declared: DictConfig) -> None:
        """The settings against `declared`, the config with the presets (and Hydra's node)."""
        keys = {key: value for key, value in leaves(declared) if key != "hydra" and not key.startswith("hydra.")}
        added = [o.key_or_group for o in settings if _adds_strategy_setting(o)]
        if added:
            check_strategy_settings(declared.hydra.runtime.choices.strategy, declared.strategy, added)
        given = [value for o in settings for value in _values(o)]
        check_data_settings([o.key_or_group for o in settings if _adds_data_setting(o)], [*keys.values(), *given])
        read = interpolations([*keys.values(), *given])
        for override in settings:  # in order: a key added (+key) or removed (~key) earlier on the line counts
            check_setting(override, keys, groups, read)
        if config_name == "train":  # (the bench turns the finder on itself in its finder points)
            note_switched_off(settings, keys)

    plain = all(o.type == OverrideType.CHANGE and not o.is_sweep_override() for o in settings)
    if defer and plain and config_dir == CONFIG_DIR and len(args) == len(overrides):  # (no -m, no --config-name)
        return check
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir), job_name=config_name):
        presets = [_first_value(o) for o in parsed if o not in settings]
        check(_compose(config_name, [*extra, *(arg for arg in presets if arg)], args, return_hydra_config=True))
        if any(o.type != OverrideType.CHANGE for o in settings):  # + and ~: what else Hydra would refuse
            _compose(config_name, [*extra, *(arg for arg in map(_first_value, parsed) if arg)], args)
    return None


@contextlib.contextmanager
def checked_when_hydra_composes(check: Callable[[DictConfig], None] | None) -> Iterator[None]:
    """Within it, Hydra's compose of the config to run the command calls `check` (check_overrides') on the config
    before it applies the command line's settings (their defaults, each preset's keys): what the check would have
    composed itself. A refusal ends the command there, before Hydra makes the run folder. Hydra has no hook at that
    point: its loader's method that applies the settings is wrapped, for one compose."""
    if check is None:
        yield
        return
    apply = ConfigLoaderImpl._apply_overrides_to_config

    def checked_then_applied(overrides: list[Override], cfg: DictConfig) -> None:
        ConfigLoaderImpl._apply_overrides_to_config = staticmethod(apply)
        try:
            check(cfg)
        except ConfigError as err:
            fail(err)
        apply(overrides, cfg)

    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(checked_then_applied)
    try:
        yield
    finally:
        ConfigLoaderImpl._apply_overrides_to_config = staticmethod(apply)


def _primary_config(args: list[str], config_name: str) -> tuple[list[str], Path, str]:
    """The command line without Hydra's --config-dir/-cd and --config-name/-cn, the folder and name of the primary
    config they give (a search's best.yaml, which composes `train`), else this package's and `config_name`."""
    rest, given = [], {}
    flags = {"--config-dir": "dir", "-cd": "dir", "--config-name": "name", "-cn": "name"}
    pending = None
    for arg in args:
        flag, equals, value = arg.partition("=")
        if pending:
            given[pending], pending = arg, None
        elif flag in flags and equals:
            given[flags[flag]] = value
        elif arg in flags:
            pending = flags[arg]
        else:
            rest.append(arg)
    folder = Path(given["dir"]).resolve() if "dir" in given else CONFIG_DIR
    return rest, folder, given.get("name", config_name)


def _compose(config_name: str, overrides: list[str], args: list[str], **kwargs: Any) -> DictConfig:
    """The config, or Hydra's refusal of the command line in one line (as every refusal)."""
    try:
        return compose(config_name, overrides=overrides, **kwargs)
    except HydraException as err:
        # `~model.net.in_features data.num_features=4`: Hydra applies them in order and resolves the removed value
        # first, which reads the still unset data.num_features ("Error merging override ~model.net.in_features").
        if isinstance(err.__cause__, InterpolationToMissingValueError) and str(err).startswith("Error merging"):
            unset = str(err.__cause__).split("Missing mandatory value: ")[-1].split()[0]
            raise ConfigError(
                f"{str(err).split()[-1]} reads {unset}, which is not set yet at that point of the command line: "
                f"give {unset}=... before it"
            ) from None
        raise ConfigError(f"{' '.join(args)}: {str(err).strip().splitlines()[0]}") from None


# The Lightning engine's group that the Accelerate engine has not, by the group that does its job there:
# `+callbacks=...` in an Accelerate project made a top-level key that nothing reads.
OTHER_ENGINE_GROUPS = {"callbacks": "oom"}
# A Lightning user's guess that the OOM toolkit's parts are callback presets (`callbacks=oom`): where they are.
OOM_TOOLKIT_PARTS = {"oom", "oom_recovery", "item_logger", "device_memory", "batch_size_finder", "memory"}


# Trainer arguments a lightning-hydra-template user gives (trainer.strategy=ddp, trainer.logger=false): the project
# passes its own to the Trainer, from its config groups, so Lightning's Trainer took these and dropped them.
CHOSEN_ELSEWHERE = {
    "trainer.strategy": lambda: f"the preset is strategy=<name> ({', '.join(_choices('strategy'))})",
    "trainer.logger": lambda: "the logger is logger=wandb or logger=none",
    "trainer.callbacks": lambda: (
        "callbacks are configs/callbacks/ (callbacks=..., +callbacks.NAME._target_=...)"
        if (CONFIG_DIR / "callbacks").is_dir()
        else "this loop has no callbacks; engine/loop.py is yours to change (the OOM toolkit: oom=toolkit)"
    ),
}


def _choices(group: str) -> list[str]:
    """The presets of a config group of this project: its folder's files."""
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


# Arguments of Lightning's Trainer that the Accelerate engine's loop has no counterpart of, said so in that engine (a
# "did you mean" pointed trainer.min_steps at trainer.max_steps, another setting).
LIGHTNING_TRAINER_ONLY = {
    "overfit_batches",
    "fast_dev_run",
    "num_sanity_val_steps",
    "check_val_every_n_epoch",
    "val_check_interval",
    "gradient_clip_algorithm",
    "detect_anomaly",
    "deterministic",
    "benchmark",
    "profiler",
    "min_epochs",
    "min_steps",
    "max_time",
    "reload_dataloaders_every_n_epochs",
}


def check_setting(override: Override, keys: dict[str, Any], groups: set[str], read: str) -> None:
    """One `key=value`, `+key=value` or `~key` against the config's `keys` (dotted key: default), which it updates;
    `read`: the interpolations (`${...}`) of the config and the command line."""
    key, kind = override.key_or_group, override.type
    if key in CHOSEN_ELSEWHERE and kind != OverrideType.DEL:  # (Lightning's Trainer took them, and the project's won)
        raise ConfigError(f"{key} is not set through the trainer here: {CHOSEN_ELSEWHERE[key]()}")
    if kind == OverrideType.ADD and key in keys:
        shown = override.get_value_element_as_str()
        raise ConfigError(f"+{key}: {key} exists; set it without +: {key}={shown} (or ++{key}={shown} to force)")
    if key.startswith("logger.") and not keys.get("logger") and kind != OverrideType.DEL:  # logger=none: {}
        sign = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(kind, "")
        raise ConfigError(f"{sign}{key}: {NO_LOGGER}")
    if kind in (OverrideType.ADD, OverrideType.FORCE_ADD) and key not in keys:
        _check_added(key, keys, read, isinstance(override.value(), dict))
    if kind in (OverrideType.CHANGE, OverrideType.DEL) and key not in keys:
        others = [  # (`doctor` for doctor.foo: its node; data.dataset._partial_ for data.dataset.root: Hydra's)
            other for other in keys if not key.startswith(f"{other}.") and not other.rpartition(".")[2].startswith("_")
        ]
        near = difflib.get_close_matches(key, others, n=1, cutoff=0.75)  # (0.6 offered `oom` for `foo`)
        hint = f"; did you mean {near[0]}?" if near else ""
        if kind == OverrideType.DEL:
            raise ConfigError(f"~{key}: there is no setting {key} to remove{hint}")
        if lightning_only := _lightning_only(key, keys):
            raise ConfigError(lightning_only)
        hint = hint or ("" if key.startswith(("model.net.", "data.dataset.")) else _named_here(key))  # (yours: theirs)
        hint = hint or _off_in_this_preset(key, keys)
        if key.startswith("strategy.") and not hint:  # (+strategy.KEY is refused too, unless DDP takes KEY)
            _check_strategy_key(key, keys)
        if _takes_arguments(key.rpartition(".")[0], keys) and not hint:  # (a typo: not a key to add)
            raise ConfigError(f"unknown setting {key} (to add a new key: +{key}=...)")
        raise ConfigError(f"unknown setting {key}{hint or _other_engines(key)}")
    if kind == OverrideType.DEL:
        parent, _, name = key.rpartition(".")
        node = keys.get(parent)
        argument = isinstance(node, dict) and "_target_" in node and parent not in READ and not name.startswith("_")
        owner = parent.rpartition(".")[0]  # a key of a dict argument (model.net.config of model=causal_lm)
        argument = argument or isinstance(keys.get(owner), dict) and "_target_" in keys[owner] and owner not in READ
        if not (argument or parent == "logger" or parent == "callbacks" and "callbacks" in groups):  # (wandb's)
            raise ConfigError(f"~{key}: {_not_removable(key, groups)}")
        if keys[key] is None:  # Hydra's words for it: "'KEY' does not exist"
            raise ConfigError(
                f"~{key}: {key} is null, which Hydra cannot remove; leave it as it is, or set it: {key}=..."
            )
        for removed in [other for other in keys if other == key or other.startswith(f"{key}.")]:
            del keys[removed]
        return
    if kind != OverrideType.CHANGE:  # +key, ++key
        keys.setdefault(key, None)
        return
    default = keys[key]
    if key == "logger._target_":  # another logger class: a key added to it after is not wandb's
        keys[key] = override.value()
    if not override.is_sweep_override() and override.value() is None:  # a node set to null (oom.recovery=null):
        for inner in [other for other in keys if other.startswith(f"{key}.")]:  # a key under it later on the line
            del keys[inner]  # is one Hydra cannot set
        keys[key] = None
    for value in _values(override):
        if isinstance(default, dict) and value is not None and not isinstance(value, dict) and "${" not in str(value):
            names = [name for name in default if not name.startswith("_")][:3]  # (Hydra: a multi-line instantiation
            example = f", e.g. {key}.{names[0]}=..." if names else ""  # error in the training, exit 1)
            raise ConfigError(
                f"{key}={override.get_value_element_as_str()}: {key} is a group of settings ({', '.join(names)}"
                f"{', ...' if len(default) > len(names) else ''}); set them one by one{example}"
            )
        if wrong := wrong_type(key, default, value):
            shown = value if isinstance(value, str) else override.get_value_element_as_str()
            raise ConfigError(f"{key}={shown} {wrong}")


def wrong_type(key: str, default: Any, value: Any) -> str:
    """Why `value` cannot replace `key`'s `default` (text or a list where the default is a number or true/false: the
    YAML files are untyped, so nothing else checks it), or ''."""
    if key in TEXT_ALSO or not isinstance(value, str | list | dict) or "${" in str(value):
        return ""
    if isinstance(default, bool):
        return f"is not true or false (the default is {str(default).lower()})"
    if isinstance(default, int | float):
        return f"is not a number (the default is {default})"
    return ""


# Settings read only while a switch has a value: setting (or node) -> (the switch, that value, what reads it).
READ_ONLY_WITH = {
    "oom.batch_size_finder": ("oom.find_batch_size", True, "only the batch-size search reads it"),
    "strategy.devices": ("strategy.mode", "layers", "only strategy.mode=layers reads it"),
    **{
        f"strategy.{name}": ("strategy.mode", "tensor", "only strategy.mode=tensor reads it")
        for name in ("tensor_parallel_size", "data_parallel_size", "replicas")
    },
}


def note_switched_off(settings: list[Override], keys: dict[str, Any]) -> None:
    """Say (a note) that a setting belongs to a part that stays off (`oom.batch_size_finder.max_batch_size=64`
    without `oom.find_batch_size=true`, `strategy.tensor_parallel_size=4` with `strategy.mode=layers`): it was taken
    without a word and never read. A note, not a refusal: a search whose space turns the switch on and off gives every
    trial the setting. (A preset without the switch: not this table's.)"""
    for override in settings:
        key = override.key_or_group
        owner = next((name for name in READ_ONLY_WITH if key == name or key.startswith(f"{name}.")), None)
        if owner is None or override.type == OverrideType.DEL or READ_ONLY_WITH[owner][0] not in keys:
            continue
        switch, on, reads = READ_ONLY_WITH[owner]
        given = [o for o in settings if o.key_or_group == switch]
        values = _values(given[-1]) if given else [keys[switch]]
        if on not in values:
            shown, now = (str(value).lower() if isinstance(value, bool) else value for value in (on, values[-1]))
            message = f"{key} is not read: {reads}, and {switch} is {now} here ({switch}={shown} turns it on)"
            warnings.warn(message, stacklevel=1)  # (from this file: a `note:` line, notes_in_one_line)


# Nodes whose keys the training reads itself (its data module, Lightning's Trainer): none may be removed with ~.
READ = {"data", "trainer"}

# Nodes whose settings the project's code reads by name (no class takes the node's keys): node -> the command that
# reads it. A key added to one is read by nothing (+oom.foo, +doctor.foo trained or planned without a word).
READ_BY_NAME = {
    **dict.fromkeys(("checkpoint", "oom", "oom.recovery", "oom.batch_size_finder"), "the training"),
    **dict.fromkeys(("doctor", "doctor.allreduce"), "the doctor"),
    "bench": "the bench",
}


def _check_added(key: str, keys: dict[str, Any], read: str, node: bool) -> None:
    """Refuse `+KEY=...` that nothing would read: a top-level key or node, a key of a node read by name (checkpoint,
    oom, doctor, bench), a key the logger does not pass on to wandb, a callback that is not a node, unless an
    interpolation reads it (`+base=0.1 model.optimizer.lr=${base}`). Taken in, it was dropped without a word
    (`+callbacks=oom` in an Accelerate project), or a traceback once the run folder was made (`+logger.foo=1`).
    (Classes built from a node refuse an argument they do not take when built; the Accelerate loop refuses the trainer
    and model settings it does not read.)"""
    parent, _, name = key.rpartition(".")
    top = key.partition(".")[0]
    if is_read(name, read):
        return
    if top not in keys:  # (+foo.bar=1 made a node foo that nothing reads)
        preset = (
            "" if "." in key or node else f" (a preset folder of yours is configs/{key}/<name>.yaml: +{key}=<name>)"
        )
        hint = _named_here(key) or _other_engines(key) or preset
        raise ConfigError(f"+{key}: no part of the training reads a top-level {top}{hint}")
    if parent in READ_BY_NAME and isinstance(keys.get(parent), dict):  # (oom.recovery=null: +oom.recovery.KEY is on)
        taken = ", ".join(sorted(str(other) for other in keys[parent]))
        raise ConfigError(f"+{key}: {READ_BY_NAME[parent]} reads no {key}, only the settings it has: {taken}")
    if parent == "logger" and (taken := _logger_arguments(keys)) and name not in taken:
        near = difflib.get_close_matches(name, taken, n=1, cutoff=0.75)
        hint = f"did you mean logger.{near[0]}? " if near else ""
        raise ConfigError(f"+{key}: wandb.init takes no {name}; {hint}it takes {', '.join(sorted(taken))}")
    if parent == "callbacks" and not node:  # Lightning's: each a node that builds one callback
        raise ConfigError(f"+{key}: a callback is a node that names its class: +callbacks.{name}._target_=PKG.CLASS")


NO_LOGGER = (
    "logger=none has no logger to take it; a logger of your own is a preset, configs/logger/NAME.yaml (its _target_ "
    "and arguments), chosen with logger=NAME"
)


def _logger_arguments(keys: dict[str, Any]) -> set[str]:
    """The keys the wandb logger config may have: wandb.init's arguments, and those of the logger class that passes
    them on (Lightning's WandbLogger takes a few of its own); empty for another logger (logger._target_=...: its
    class refuses an argument it does not take when built)."""
    target = keys.get("logger._target_")
    if target and "wandb" not in str(target).lower():
        return set()
    import wandb  # (only for a key added to the logger: it takes a second to import)

    taken = set(inspect.signature(wandb.init).parameters)
    if target:
        for cls in inspect.getmro(get_object(target)):
            if "__init__" in vars(cls):
                taken |= set(named_arguments(cls.__init__))
    return taken - {"self"}


def _takes_arguments(node: str, keys: dict[str, Any]) -> bool:
    """Whether a key added to `node` can be read: the node builds a class that takes it (a `_target_`: the optimizer,
    the net, the dataset, Lightning's Trainer) or passes it on (the logger's keys, to wandb)."""
    settings = keys.get(node)
    return isinstance(settings, dict) and ("_target_" in settings or node == "logger")


def is_read(name: str, read: str) -> bool:
    """Whether an interpolation in `read` ends in the key `name` (`${name}`, `${node.name}`)."""
    return any(f"{start}{name}" + "}" in read for start in (".", "{"))


# Settings this project has under another name than Hugging Face's Trainer, the accelerate examples or Lightning's
# Trainer arguments given at the top: an unknown setting of such a name says this project's (it said nothing).
NAMES_HERE = {
    "gradient_accumulation_steps": "trainer.accumulate_grad_batches",
    "mixed_precision": "trainer.precision (32-true, bf16-mixed, 16-mixed)",
    "fp16": "trainer.precision=16-mixed",
    "bf16": "trainer.precision=bf16-mixed",
    "resume_from_checkpoint": "ckpt_path (a checkpoint), or run_id (continues that run's last)",
    "num_train_epochs": "trainer.max_epochs",
    "max_train_steps": "trainer.max_steps",
    "max_grad_norm": "trainer.gradient_clip_val",
    "learning_rate": "model.optimizer.lr",
    "weight_decay": "model.optimizer.weight_decay",
    "per_device_train_batch_size": "data.batch_size (the GLOBAL batch: per device x processes x accumulation)",
    "train_batch_size": "data.batch_size (the GLOBAL batch: per device x processes x accumulation)",
    "batch_size": "data.batch_size (the GLOBAL batch)",
    "logging_steps": "trainer.log_every_n_steps",
    "save_steps": "checkpoint.every_n_steps",
    "output_dir": "hydra.run.dir, or experiment= and run_id= (outputs/<experiment>/<run_id>)",
    "report_to": "logger=wandb or logger=none",
    "warmup_steps": "scheduler.warmup_steps",
    "num_workers": "data.num_workers",
    "max_epochs": "trainer.max_epochs",
    "max_steps": "trainer.max_steps",
    "precision": "trainer.precision",
    "devices": "trainer.devices",
}


def _named_here(key: str) -> str:
    """ "; this project's name for it: ..." for `key`, another library's name of a setting (NAMES_HERE); else ""."""
    here = NAMES_HERE.get(key.rpartition(".")[2])
    return f"; this project's name for it: {here}" if here and not here.startswith(key) else ""


def _off_in_this_preset(key: str, keys: dict[str, Any]) -> str:
    """ "; NODE is null (off) here; ..." for a key under a node the chosen preset, or the command line, leaves null
    (`oom.recovery.policy=skip` with oom=none, or after oom.recovery=null); else ""."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        node = ".".join(parts[:end])
        if node in keys and keys[node] is None and (CONFIG_DIR / parts[0]).is_dir():
            presets = _choices(parts[0])
            return f"; {node} is null (off) here; the {parts[0]} presets: {', '.join(presets)}"
    return ""


def _other_engines(key: str) -> str:
    group = key.partition(".")[0]
    other = OTHER_ENGINE_GROUPS.get(group)
    if not other or not (CONFIG_DIR / other).is_dir() or (CONFIG_DIR / group).is_dir():  # (this engine's own group)
        return ""
    choices = ", ".join(_choices(other))
    return (
        f" ({key.partition('.')[0]} is the Lightning engine's config group; this loop has none: engine/loop.py is "
        f"yours to change; its OOM toolkit is {other}: {choices})"
    )


def _lightning_only(key: str, keys: dict[str, Any]) -> str:
    """Why the Accelerate engine (the project without a `callbacks` group) has no `key` that Lightning's
    Trainer takes; "" otherwise."""
    group, _, name = key.rpartition(".")
    if group != "trainer" or name not in LIGHTNING_TRAINER_ONLY or (CONFIG_DIR / "callbacks").is_dir():
        return ""
    reads = ", ".join(sorted(other.partition(".")[2] for other in keys if other.startswith("trainer.")))
    return f"trainer.{name} is a setting of Lightning's Trainer, not of this loop; it reads: {reads}"


def _not_removable(key: str, groups: set[str]) -> str:
    """Why `~key` is refused (the training reads the key: a traceback after the run folder was made), and what ~
    may remove instead."""
    callbacks = ", a callback (~callbacks.NAME)" if "callbacks" in groups else ""
    may = f"~ removes an argument of a class (e.g. ~model.optimizer.fused){callbacks} or the logger (~logger)"
    if (CONFIG_DIR / key).is_dir():
        choices = ", ".join(_choices(key))
        return f"the training needs its {key} settings; choose a preset ({key}={choices}) or set its keys; {may}"
    return f"the training reads {key}; set it instead ({key}=...); {may}"


def without_logger(overrides: list[str]) -> list[str]:
    """`~logger` is `logger=none`: no logger (the training reads cfg.logger: removed, it was a traceback)."""
    return ["logger=none" if arg == "~logger" or arg.startswith("~logger=") else arg for arg in overrides]


def _values(override: Override) -> list[Any]:
    """The value of `key=value`, or each value of a --multirun sweep that lists them (`a,b`, `choice(a,b)`)."""
    if not override.is_sweep_override():
        return [override.value()]
    sweep = override.value()
    return list(sweep.list) if isinstance(sweep, ChoiceSweep) else []


def _first_value(override: Override) -> str | None:
    """The override as one value: a sweep's first (the keys it composes are the same for every value); None for a
    sweep that lists no values (`interval(...)`: a sweeper plugin's)."""
    if not override.is_sweep_override():
        return override.input_line
    values = _sweep_values(override.input_line, [])
    if not values:
        return None
    prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(override.type, "")
    package = f"@{override.package}" if override.package else ""
    return f"{prefix}{override.key_or_group}{package}={values[0]}"


def _adds_data_setting(override: Override) -> bool:
    """`+data.KEY=...` (not `+data.dataset.KEY`, which the dataset takes or refuses)."""
    key = override.key_or_group
    return override.type == OverrideType.ADD and key.startswith("data.") and key.count(".") == 1


def check_data_settings(added: list[str], settings: list[Any]) -> None:
    """Refuse `+data.KEY=...` that neither the loaders take (data.loading.Data's settings) nor a setting of the
    config or the command line reads (`${...KEY}`, as the model's keys read data.num_features), in one line. Taken
    in, it was dropped without a word: `+data.root=DIR` meant for the dataset (data.dataset.root),
    `+data.pin_memory=true`."""
    from .data.loading import Data  # (torch: only when such a key is given)

    taken = set(inspect.signature(Data.__init__).parameters) - {"self", "interpolated"}
    read = interpolations(settings)
    for key in added:
        name = key.partition(".")[2]
        if name not in taken and not is_read(name, read):
            raise ConfigError(
                f"+{key} is not a setting the data loaders take ({', '.join(sorted(taken - {'dataset'}))}) and no "
                f"setting reads it; one for your dataset's class goes under data.dataset: +data.dataset.{name}=..."
            )


def interpolations(settings: list[Any]) -> str:
    """The settings that read others (`${...}`), as one text."""
    return " ".join(value for value in settings if isinstance(value, str) and "${" in value)


def _adds_strategy_setting(override: Override) -> bool:
    return override.type == OverrideType.ADD and override.key_or_group.startswith("strategy.")


def _check_strategy_key(key: str, keys: dict[str, Any]) -> None:
    """`strategy.KEY=...` of a key the preset lacks: its settings, not the `+strategy.KEY` hint, which
    check_strategy_settings refuses but for the arguments DistributedDataParallel takes."""
    name = key.split(".")[1]
    if name in passed_on(OmegaConf.create({"_target_": keys.get("strategy._target_")})):
        return
    settings = sorted({other.split(".")[1] for other in keys if other.startswith("strategy.")} - {"_target_"})
    valid = f"its settings: {', '.join(settings)}" if settings else "it has no settings"
    raise ConfigError(f"unknown setting {key}: the strategy preset has no {name}; {valid}")


def check_strategy_settings(preset: str, declared: Any, added: list[str]) -> None:
    """Refuse `+strategy.<name>=...` that the preset does not have (its settings: its config file's), in one line
    naming them. Taken in, it reached the strategy's class: a TypeError (fsdp's tensor_parallel_size "got multiple
    values"), or, where Lightning's DDPStrategy passes it on to torch's DistributedDataParallel, a traceback inside
    the training processes after the run folder and the wandb run were made. DistributedDataParallel's own options
    (e.g. static_graph) stay open under a preset whose class is Lightning's DDPStrategy."""
    settings = set(declared) - {"_target_"} if isinstance(declared, DictConfig) else set()
    unknown = [key for key in added if key.split(".")[1] not in settings | passed_on(declared)]
    if unknown:
        names = ", ".join(unknown)
        valid = f"its settings: {', '.join(sorted(settings))}" if settings else "it has no settings"
        raise ConfigError(f"strategy={preset} has no {names}; {valid}")


def passed_on(declared: Any) -> set[str]:
    """The keyword arguments a preset's strategy class hands to what it wraps: Lightning's DDPStrategy (itself, not a
    subclass), torch's DistributedDataParallel's."""
    target = declared.get("_target_") if isinstance(declared, DictConfig) else None
    if target != "lightning.pytorch.strategies.DDPStrategy":
        return set()
    ddp = get_object("torch.nn.parallel.DistributedDataParallel")
    return set(inspect.signature(ddp.__init__).parameters) - {"self", "module"}


def _is_key(override: Override) -> bool:
    """A setting (trainer.max_epochs=2), not a preset choice (strategy=ddp): config groups are folders."""
    return not (CONFIG_DIR / override.key_or_group).is_dir()


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every setting, unresolved (${...} stays text)."""
    container = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node
    for key, value in container.items():
        name = f"{prefix}{key}"
        yield name, value
        if isinstance(value, dict):
            yield from leaves(value, f"{name}.")


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
        sys.argv[1:] = continue_last(sys.argv[1:])
    except ConfigError as err:
        fail(err)
    skip_the_hydra_mode_probe(sys.argv[1:])
    with checked_when_hydra_composes(deferred):
        run()


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


def _flag_key(name: str, config_name: str) -> str:
    """The key a `--name` most likely meant: the command's own setting, a top-level one (seed), the trainer's, else
    one of the command's own."""
    node = SETTINGS_NODE.get(config_name, config_name)
    if name in OmegaConf.load(CONFIG_DIR / f"{config_name}.yaml").get(node, {}):
        return f"{node}.{name}"
    if name in OmegaConf.load(CONFIG_DIR / "train.yaml"):
        return name
    if name in OmegaConf.load(CONFIG_DIR / "trainer" / "default.yaml"):
        return f"trainer.{name}"
    return f"{node}.{name}"


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
            group = next((name for name in sorted(training_groups()) if arg in _choices(name)), None)
            raise ConfigError(
                f"{arg} is not a setting: this command takes key=value" + (f", e.g. {group}={arg}" if group else "")
            )
        previous = arg
        flag = arg.partition("=")[0]
        if arg.startswith("-") and not _hydra_flag(flag) and not arg.lstrip("-")[:1].isdigit():
            name = flag.lstrip("-").replace("-", "_")
            raise ConfigError(
                f"{flag} is not an option of this command: its settings are key=value, e.g. "
                f"{_flag_key(name, config_name)}=... (--help lists them)"
            )


def _takes_value(flag: str) -> bool:
    """One of Hydra's options that takes the next argument as its value, abbreviated too (--config-n best)."""
    if flag.startswith("--") and len(flag) > 2:
        return any(known.startswith(flag) for known in HYDRA_VALUED if known.startswith("--"))
    return flag in HYDRA_VALUED


def _hydra_flag(flag: str) -> bool:
    """One of Hydra's options as argparse takes them: a long one abbreviated (--multi), a short one with its value
    attached (-cjob)."""
    if flag.startswith("--"):
        return any(known.startswith(flag) for known in HYDRA_FLAGS if known.startswith("--"))
    return any(flag.startswith(known) for known in HYDRA_FLAGS if not known.startswith("--"))


def notes_in_one_line() -> None:
    """Show this project's own warnings (a preset that falls back to one device, say) as one `note:` line, as its other
    notes are, not as Python's file, line and source line; other libraries' warnings as they are."""
    package, shown = str(Path(__file__).parent), warnings.formatwarning

    def note(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
        if str(filename).startswith(package):
            return f"note: {message}\n"
        return shown(message, category, filename, lineno, line)

    warnings.formatwarning = note


def check_seed_and_names(overrides: list[str]) -> None:
    """Refuse a seed torch and numpy do not take (a traceback after the run folder was made) and a run name that
    leaves outputs/<experiment>/ (run_id=../x wrote beside the project's outputs)."""
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        for given in _sweep_values(override, [value]) if key in ("seed", "run_id", "experiment") else []:
            if key == "seed" and not (given.isdigit() and int(given) < 2**32):
                raise ConfigError(f"seed={given} must be a whole number from 0 to {2**32 - 1} (the default is 42)")
            if key != "seed" and ("/" in given or given in ("", ".", "..") or _parsed(override) in (None, "")):
                raise ConfigError(
                    f"{key}={given} must name one folder (outputs/<experiment>/<run_id>): no / or .., not empty or "
                    "null (leave it out for the default)"
                )


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
            item.partition("=")[2]
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


def register_resolvers() -> None:
    resolvers = {
        "default_run_id": default_run_id,
        "wandb_mode": wandb_mode,
        "data_files": data_files,
        "data_streaming": streamed_shapes,
        "best_mode": best_mode,
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def build_object(node: DictConfig, *, bad_arguments: tuple[type[Exception], ...] = (), **kwargs: Any) -> Any:
    """hydra.utils.instantiate, with a bad argument (ValueError, TypeError or one of `bad_arguments`), a target
    that does not import, or a package it asks for that is not installed (ImportError: e.g. Lightning's
    trainer.accelerator=tpu without torch_xla) reported as a ConfigError instead of a traceback."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ConfigError):  # the object's own refusal says what is valid
            raise cause from err
        if (unimportable := not_importable(err)) is not None:  # e.g. data.dataset._target_=my_pkg.Typo
            raise unimportable from err
        if isinstance(cause, (ValueError, TypeError, ImportError, *bad_arguments)):
            raise ConfigError(f"{node.get('_target_', 'config')}: {cause}{_arguments_taken(node, cause)}") from err
        raise


def named_arguments(function: Callable[..., Any]) -> list[str]:
    """The arguments `function` takes by name (not *args, **kwargs)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name, p in inspect.signature(function).parameters.items() if p.kind in kinds]


def _arguments_taken(node: DictConfig, cause: Exception) -> str:
    """For "got an unexpected keyword argument 'X'": the arguments the class takes, and the nearest to X."""
    unexpected = str(cause).partition("unexpected keyword argument ")[2].strip("'\"")
    try:
        names = named_arguments(get_object(node._target_))
    except (AttributeError, TypeError, ValueError, ImportError):
        return ""
    if not unexpected or not names:
        return ""
    near = difflib.get_close_matches(unexpected, names, n=1, cutoff=0.75)
    return f"; it takes {', '.join(names)}" + (f" (did you mean {near[0]}?)" if near else "")
