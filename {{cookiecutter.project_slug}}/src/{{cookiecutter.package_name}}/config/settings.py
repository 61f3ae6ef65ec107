"""One setting of the command line (`key=value`, `+key=...`, `~key`) checked against the config it changes: the key
exists (or the nearest one is named), the value has the default's type, and something reads it."""

import difflib
import inspect
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.override_parser.types import ChoiceSweep, Override, OverrideType
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from . import CONFIG_DIR
from .groups import OTHER_ENGINE_GROUPS, presets_of
from .objects import named_arguments

# Settings whose default is a number but which also take text (Lightning's devices: "auto", "0,1").
TEXT_ALSO = {"trainer.devices", "data.num_workers"}  # a number, or auto


# Trainer arguments a lightning-hydra-template user gives (trainer.strategy=ddp, trainer.logger=false): the project
# passes its own to the Trainer, from its config groups, so Lightning's Trainer took these and dropped them.
CHOSEN_ELSEWHERE = {
    "trainer.strategy": lambda: f"the preset is strategy=<name> ({', '.join(presets_of('strategy'))})",
    "trainer.logger": lambda: "the logger is logger=wandb or logger=none",
    "trainer.callbacks": lambda: (
        "callbacks are configs/callbacks/ (callbacks=..., +callbacks.NAME._target_=...)"
        if (CONFIG_DIR / "callbacks").is_dir()
        else "this loop has no callbacks; engine/loop.py is yours to change (the OOM toolkit: oom=toolkit)"
    ),
}


# Arguments of Lightning's Trainer that the Accelerate engine's loop has no counterpart of, said so in that engine (a
# "did you mean" pointed trainer.min_steps at trainer.max_steps, another setting).
LIGHTNING_TRAINER_ONLY = {
    "overfit_batches",
    "fast_dev_run",
    "num_sanity_val_steps",
    "check_val_every_n_epoch",
    "val_check_interval",
    "detect_anomaly",
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
    if (key == "trainer.max_time" or key.startswith("trainer.max_time.")) and kind != OverrideType.DEL:
        raise ConfigError(
            f"{key} is not taken: a time limit stops the training at no set step, so a continued run took itself for "
            "finished or trained on; give trainer.max_steps (a SLURM job's --time: launch/slurm.sbatch saves, and the "
            "job is requeued and continues)"
        )
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
        hint = ("" if key.startswith(("model.net.", "data.dataset.")) else _named_here(key)) or hint  # (yours: theirs)
        hint = hint or _off_in_this_preset(key, keys)
        if key.startswith("strategy.") and not hint:  # (+strategy.KEY is refused too, unless DDP takes KEY)
            _check_strategy_key(key, keys)
        if _takes_arguments(key.rpartition(".")[0], keys) and not hint:  # (a typo: not a key to add)
            raise ConfigError(f"unknown setting {key} (to add a new key: +{key}=...)")
        parent = key.rpartition(".")[0]
        if not hint and parent in READ_BY_NAME and isinstance(keys.get(parent), dict):  # (it named none of them)
            has = _has(parent, keys)
            raise ConfigError(f"unknown setting {key}: {READ_BY_NAME[parent]} reads only the settings it has: {has}")
        raise ConfigError(f"unknown setting {key}{hint or _other_engines(key)}")
    if kind == OverrideType.DEL:
        parent, _, name = key.rpartition(".")
        node = keys.get(parent)
        argument = isinstance(node, dict) and "_target_" in node and parent not in READ and not name.startswith("_")
        owner = parent.rpartition(".")[0]  # a key of a dict argument (model.net.config of model=causal_lm)
        argument = argument or isinstance(keys.get(owner), dict) and "_target_" in keys[owner] and owner not in READ
        if not (argument or parent == "logger" or parent == "callbacks" and "callbacks" in groups):  # (wandb's)
            raise ConfigError(f"~{key}: {not_removable(key, groups)}")
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
    for value in override_values(override):
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
    if isinstance(default, bool) and isinstance(value, int | float) and not isinstance(value, bool):
        return f"is not true or false (the default is {str(default).lower()})"  # (2 was taken as true)
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
        values = override_values(given[-1]) if given else [keys[switch]]
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
        raise ConfigError(
            f"+{key}: {READ_BY_NAME[parent]} reads no {key}, only the settings it has: {_has(parent, keys)}"
        )
    taken = _logger_arguments(keys) if parent == "logger" else set()
    if taken and name in LOGGER_SET_HERE:
        raise ConfigError(
            f"+{key}: the training sets it itself (one wandb run per training, its restarts continuing it, with the "
            "resolved config): name the training with run_id=NAME, its wandb run with +logger.name=NAME"
        )
    if taken and name not in taken:
        near = difflib.get_close_matches(name, taken, n=1, cutoff=0.75)
        hint = f"did you mean logger.{near[0]}? " if near else ""
        raise ConfigError(f"+{key}: wandb.init takes no {name}; {hint}it takes {', '.join(sorted(taken))}")
    if parent == "callbacks" and not node:  # Lightning's: each a node that builds one callback
        raise ConfigError(f"+{key}: a callback is a node that names its class: +callbacks.{name}._target_=PKG.CLASS")


NO_LOGGER = (
    "logger=none has no logger to take it; a logger of your own is a preset, configs/logger/NAME.yaml (its _target_ "
    "and arguments), chosen with logger=NAME"
)


def _has(node: str, keys: dict[str, Any]) -> str:
    """The settings of a node read by name (READ_BY_NAME), listed."""
    return ", ".join(sorted(str(name) for name in keys[node]))


# wandb.init's arguments (and Lightning's WandbLogger's) that the training sets (tracking/wandb_run.py): taken from
# the command line, Lightning refused them with a Python error, the Accelerate engine dropped them
LOGGER_SET_HERE = {"id", "resume", "resume_from", "fork_from", "settings", "config", "version", "save_dir", "offline"}


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
    return taken - {"self"} - LOGGER_SET_HERE


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


# lightning-hydra-template's top-level settings: a user of it types them first (`test=false` was "unknown setting
# test", `train=false` "did you mean trainer?").
TOP_LEVEL_NAMES_HERE = {
    "tags": "+logger.tags=[a,b] (the wandb run's tags)",
    "test": "test_after_fit (false: no test pass after training)",
    "train": "none: the command trains; to test a checkpoint alone, see docs/outputs.md (testing a checkpoint again)",
    "debug": "none: a quick run is trainer.max_steps=5 trainer.limit_val_batches=2",
    "accelerator": "trainer.accelerator",
    "data_dir": "data.dir",
}


def _named_here(key: str) -> str:
    """ "; this project's name for it: ..." for `key`, another library's name of a setting (NAMES_HERE, and at the
    top, TOP_LEVEL_NAMES_HERE); else ""."""
    here = TOP_LEVEL_NAMES_HERE.get(key) or NAMES_HERE.get(key.rpartition(".")[2])
    return f"; this project's name for it: {here}" if here and here.partition(" ")[0] != key else ""


def _off_in_this_preset(key: str, keys: dict[str, Any]) -> str:
    """ "; NODE is null (off) here; ..." for a key under a node the chosen preset, or the command line, leaves null
    (`oom.recovery.policy=skip` with oom=none, or after oom.recovery=null); else ""."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        node = ".".join(parts[:end])
        if node in keys and keys[node] is None and (CONFIG_DIR / parts[0]).is_dir():
            presets = presets_of(parts[0])
            return f"; {node} is null (off) here; the {parts[0]} presets: {', '.join(presets)}"
    return ""


def _other_engines(key: str) -> str:
    group = key.partition(".")[0]
    other = OTHER_ENGINE_GROUPS.get(group)
    if not other or not (CONFIG_DIR / other).is_dir() or (CONFIG_DIR / group).is_dir():  # (this engine's own group)
        return ""
    choices = ", ".join(presets_of(other))
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


def not_removable(key: str, groups: set[str]) -> str:
    """Why `~key` is refused (the training reads the key: a traceback after the run folder was made), and what ~
    may remove instead."""
    callbacks = ", a callback (~callbacks.NAME)" if "callbacks" in groups else ""
    may = f"~ removes an argument of a class (e.g. ~model.optimizer.fused){callbacks} or the logger (~logger)"
    if (CONFIG_DIR / key).is_dir():
        choices = ", ".join(presets_of(key))
        return f"the training needs its {key} settings; choose a preset ({key}={choices}) or set its keys; {may}"
    return f"the training reads {key}; set it instead ({key}=...); {may}"


def override_values(override: Override) -> list[Any]:
    """The value of `key=value`, or each value of a --multirun sweep that lists them (`a,b`, `choice(a,b)`)."""
    if not override.is_sweep_override():
        return [override.value()]
    sweep = override.value()
    return list(sweep.list) if isinstance(sweep, ChoiceSweep) else []


def adds_data_setting(override: Override) -> bool:
    """`+data.KEY=...` (not `+data.dataset.KEY`, which the dataset takes or refuses)."""
    key = override.key_or_group
    return override.type == OverrideType.ADD and key.startswith("data.") and key.count(".") == 1


def check_data_settings(added: list[str], settings: list[Any]) -> None:
    """Refuse `+data.KEY=...` that neither the loaders take (data.loading.Data's settings) nor a setting of the
    config or the command line reads (`${...KEY}`, as the model's keys read data.num_features), in one line. Taken
    in, it was dropped without a word: `+data.root=DIR` meant for the dataset (data.dataset.root),
    `+data.pin_memory=true`."""
    from ..data.loading import Data  # (torch: only when such a key is given)

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


def adds_strategy_setting(override: Override) -> bool:
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
    (e.g. static_graph) stay open under ddp and ddp_spawn (passed_on)."""
    settings = set(declared) - {"_target_"} if isinstance(declared, DictConfig) else set()
    unknown = [key for key in added if key.split(".")[1] not in settings]
    if unknown:  # (only then: the strategy's class is imported, which imports torch)
        unknown = [key for key in unknown if key.split(".")[1] not in passed_on(declared)]
    if unknown:
        names = ", ".join(unknown)
        valid = f"its settings: {', '.join(sorted(settings))}" if settings else "it has no settings"
        raise ConfigError(f"strategy={preset} has no {names}; {valid}")


def passed_on(declared: Any) -> set[str]:
    """The keyword arguments a preset's strategy class hands to torch's DistributedDataParallel: Lightning's
    DDPStrategy (itself, not a subclass) every one of them; a class of this project the ones its `passed_on` names
    (the Accelerate engine's DDP: those accelerate passes on)."""
    target = declared.get("_target_") if isinstance(declared, DictConfig) else None
    if target == "lightning.pytorch.strategies.DDPStrategy":
        ddp = get_object("torch.nn.parallel.DistributedDataParallel")
        return set(inspect.signature(ddp.__init__).parameters) - {"self", "module"}
    if not isinstance(target, str) or target.split(".")[0] != __name__.split(".")[0]:
        return set()
    try:
        return set(getattr(get_object(target), "passed_on", ()))
    except (ImportError, AttributeError, ValueError):  # (a _target_ that does not import is refused where it is built)
        return set()


def is_key(override: Override, folders: tuple[Path, ...] = (CONFIG_DIR,)) -> bool:
    """A setting (trainer.max_epochs=2), not a preset choice (strategy=ddp): config groups are folders, of the
    package's configs or of the config folders the command line adds (--config-dir, hydra.searchpath)."""
    return not any((folder / override.key_or_group).is_dir() for folder in folders)


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every setting, unresolved (${...} stays text)."""
    container = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node
    for key, value in container.items():
        name = f"{prefix}{key}"
        yield name, value
        if isinstance(value, dict):
            yield from leaves(value, f"{name}.")
