"""The command line's settings checked before Hydra makes a run folder: against a compose of the config with the
command's presets, or inside the compose Hydra runs the command with."""

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError

from ..errors import ConfigError, fail
from . import CONFIG_DIR
from .groups import sweep_values, training_groups
from .settings import (
    adds_data_setting,
    adds_strategy_setting,
    check_data_settings,
    check_setting,
    check_strategy_settings,
    interpolations,
    is_key,
    leaves,
    not_removable,
    note_switched_off,
    override_values,
)

MULTIRUN = ("-m", "--multirun")


def unparsable(args: list[str]) -> ConfigError:
    """The refusal of the first of `args` that Hydra's override grammar cannot parse, with its reason: most often a
    value with ${...}, brackets or a comma that needs quotes of its own inside the shell's."""
    for arg in args:
        try:
            OverridesParser.create().parse_override(arg)
        except HydraException as error:
            lines = str(error).splitlines()
            reason = lines[1] if len(lines) > 1 else lines[0] if lines else "no reason given"
            key, _, value = arg.partition("=")
            if "$" in value:  # an interpolation, whose braces and comma the grammar reads as its own
                hint = f"an interpolation is quoted inside the shell's quotes: '{key}=\"{value}\"'"
            else:
                hint = "Hydra's override grammar takes key=value, a list as key=[a,b], text with spaces in quotes"
            return ConfigError(f"{arg} cannot be parsed ({reason}); {hint}")
    return ConfigError(f"Hydra cannot parse the overrides {args}")


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
    args, config_dir, config_name, added = primary_config(args, config_name)  # (a search's best.yaml: --config-dir)
    if any(arg.startswith("-") for arg in args):  # --cfg, --help ...: Hydra's to check
        return None
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException:
        raise unparsable(args) from None  # (Hydra's report: 4 lines, exit 1)
    multirun = any(arg in MULTIRUN for arg in overrides) or "hydra.mode=MULTIRUN" in args
    if not multirun and (sweep := next((o for o in parsed if o.is_sweep_override()), None)):  # (Hydra: 5 lines)
        raise ConfigError(
            f"{sweep.input_line}: several values train one run each with -m (--multirun); for one run give one value "
            "(a list: key=[a,b]; text with a comma: key='a,b')"
        )
    added += searched_folders(parsed)  # hydra.searchpath=[file://DIR]: presets of yours kept outside the package
    # The package's configs (the `train` a best.yaml composes) and a --config-dir that adds presets, searched too
    extra = [f"hydra.searchpath=[{', '.join(f'file://{path}' for path in added)}]"] if added else []
    folders = (config_dir, *added)
    settings = [o for o in parsed if is_key(o, folders) and not o.key_or_group.startswith("hydra")]
    groups = training_groups()
    for override in parsed:
        group = override.key_or_group
        if not is_key(override, folders) and override.type == OverrideType.DEL:
            raise ConfigError(f"~{group}: {not_removable(group, groups)}")
        if (
            not is_key(override, folders)
            and override.type == OverrideType.ADD
            and group in groups
            and not override.package
        ):
            raise ConfigError(f"+{group}: a preset of {group} is chosen already; choose another without +: {group}=...")
    if not settings:
        return None

    def check(declared: DictConfig) -> None:
        """The settings against `declared`, the config with the presets (and Hydra's node)."""
        keys = {key: value for key, value in leaves(declared) if key != "hydra" and not key.startswith("hydra.")}
        added = [o.key_or_group for o in settings if adds_strategy_setting(o)]
        if added:
            check_strategy_settings(declared.hydra.runtime.choices.strategy, declared.strategy, added)
        given = [value for o in settings for value in override_values(o)]
        check_data_settings([o.key_or_group for o in settings if adds_data_setting(o)], [*keys.values(), *given])
        read = interpolations([*keys.values(), *given])
        for override in settings:  # in order: a key added (+key) or removed (~key) earlier on the line counts
            check_setting(override, keys, groups, read)
        if config_name == "train":  # (the bench turns the finder on itself in its finder points)
            note_switched_off(settings, keys)

    plain = all(o.type == OverrideType.CHANGE and not o.is_sweep_override() for o in settings)
    if defer and plain and not added and not multirun and len(args) == len(overrides):  # (no --config-name either)
        return check
    parsed = [o for o in parsed if o.key_or_group != "hydra.searchpath"]  # (in `extra`, with the folders it adds)
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


def primary_config(args: list[str], config_name: str) -> tuple[list[str], Path, str, list[Path]]:
    """The command line without Hydra's --config-dir/-cd and --config-name/-cn; the folder and name of the primary
    config they give (a search's best.yaml, which composes `train`), else this package's and `config_name`; and the
    config folders to search besides the primary's: the package's, or a --config-dir of presets (Hydra searches it
    for the package's `train` too). A primary config of another folder that does not compose `train` (a run's
    config.yaml, a record of one run) is refused: it has none of the presets the training reads."""
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
    name = given.get("name", config_name)
    folder = Path(given["dir"]).resolve() if "dir" in given else CONFIG_DIR
    if folder == CONFIG_DIR:
        return rest, folder, name, []
    primary = folder / f"{name.removesuffix('.yaml')}.yaml"
    if not primary.is_file():  # a folder of presets of yours, searched for this command's own config
        return rest, CONFIG_DIR, name, [folder]
    defaults = OmegaConf.load(primary).get("defaults") or []
    if "train" not in defaults:
        raise ConfigError(
            f"--config-name {name}: {primary} does not compose the training's config (its defaults list has no "
            "`train`, as a search's best.yaml has): a run's config.yaml records that run; run it again with its "
            "command line, or continue it with run_id=<its folder's name>"
        )
    return rest, folder, name, [CONFIG_DIR]


def searched_folders(parsed: list[Override]) -> list[Path]:
    """The folders a `hydra.searchpath=[file://DIR, ...]` of the command line adds."""
    paths = [o.value() for o in parsed if o.key_or_group == "hydra.searchpath" and not o.is_sweep_override()]
    return [Path(str(p).removeprefix("file://")) for value in paths for p in value if str(p).startswith("file://")]


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


def _first_value(override: Override) -> str | None:
    """The override as one value: a sweep's first (the keys it composes are the same for every value); None for a
    sweep that lists no values (`interval(...)`: a sweeper plugin's)."""
    if not override.is_sweep_override():
        return override.input_line
    values = sweep_values(override.input_line, [])
    if not values:
        return None
    prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(override.type, "")
    package = f"@{override.package}" if override.package else ""
    return f"{prefix}{override.key_or_group}{package}={values[0]}"
