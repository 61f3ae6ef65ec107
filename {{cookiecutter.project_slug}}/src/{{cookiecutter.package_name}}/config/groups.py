"""The config groups (configs/<group>/<preset>.yaml): a preset chosen on the command line checked against the
folder's files, in one line that lists them."""

from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from . import CONFIG_DIR


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
            choices = presets_of(group)
        elif has_value and group.startswith("hydra/"):  # Hydra's own groups (hydra/launcher=...), its plugins' too
            choices = hydra_group_options(group)
        else:
            continue
        for value in sweep_values(override, [choice]):
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
            f"{group}={choice}: the {group} presets are for `python -m {package.name}.{group}`, not this command"
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


def sweep_values(override: str, single: list[str]) -> list[str]:
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


# The Lightning engine's group that the Accelerate engine has not, by the group that does its job there:
# `+callbacks=...` in an Accelerate project made a top-level key that nothing reads.
OTHER_ENGINE_GROUPS = {"callbacks": "oom"}


# A Lightning user's guess that the OOM toolkit's parts are callback presets (`callbacks=oom`): where they are.
OOM_TOOLKIT_PARTS = {"oom", "oom_recovery", "item_logger", "device_memory", "batch_size_finder", "memory"}


def presets_of(group: str) -> list[str]:
    """The presets of a config group of this project: its folder's files."""
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def without_logger(overrides: list[str]) -> list[str]:
    """`~logger` is `logger=none`: no logger (the training reads cfg.logger: removed, it was a traceback)."""
    return ["logger=none" if arg == "~logger" or arg.startswith("~logger=") else arg for arg in overrides]
