"""Which built-in strategy preset (configs/strategy/<name>.yaml) a run's strategy is. How a preset's processes are
started, which checks and OOM tools apply and how it resumes are keyed on that name; a preset file of yours (ddp.yaml
copied as ddp4.yaml with other settings, or naming a subclass of its strategy) is the built-in preset whose strategy
class it keeps."""

import functools
import importlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

BUILT_IN = ("single", "ddp", "ddp_spawn", "dp", "fsdp", "model_parallel", "pipeline")
STRATEGY_CONFIGS = Path(__file__).parents[1] / "configs" / "strategy"
SPAWNED = ("spawn", "fork", "forkserver")  # Lightning's start methods of ddp_spawn's kind (its default: popen)


def strategy_class(strategy: Any) -> tuple[Any, bool]:
    """What tells the presets apart: the strategy's class (a name such as Lightning's `auto` for single, or the text
    of a `_target_` that cannot be imported) and whether it spawns its processes (Lightning's ddp_spawn is its
    DDPStrategy with start_method=spawn)."""
    if not isinstance(strategy, DictConfig | dict):
        return str(strategy), False
    target = str(strategy.get("_target_"))
    module, _, name = target.rpartition(".")
    try:  # (not Hydra's get_class: it logs an error for a function, Lightning's model_parallel preset's _target_)
        found: Any = getattr(importlib.import_module(module), name)  # DDPStrategy, or its module's path: one class
    except Exception:  # noqa: BLE001  (Hydra's words for it come when the training builds it)
        found = target
    return found, strategy.get("start_method") in SPAWNED


@functools.cache
def built_in_classes() -> dict[tuple[Any, bool], str]:
    return {strategy_class(OmegaConf.load(STRATEGY_CONFIGS / f"{name}.yaml").strategy): name for name in BUILT_IN}


def built_in_preset(choice: str, strategy: Any) -> str:
    """`choice` (strategy=NAME) if it is a built-in preset, else the built-in preset with the same strategy class, or
    the nearest one it derives from; a class of its own derives from none: `choice` (the built-in checks skip it)."""
    if choice in BUILT_IN:
        return choice
    found, spawned = strategy_class(strategy)
    if (found, spawned) in built_in_classes():
        return built_in_classes()[found, spawned]
    if isinstance(found, type):  # a subclass of a preset's class: the nearest base
        for base in found.__mro__[1:]:
            if (base, spawned) in built_in_classes():
                return built_in_classes()[base, spawned]
    return choice
