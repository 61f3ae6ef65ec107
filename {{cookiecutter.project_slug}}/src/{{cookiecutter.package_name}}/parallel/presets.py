"""Which built-in strategy preset (configs/strategy/<name>.yaml) a run's strategy is. How a preset's processes are
started, which checks and OOM tools apply and how it resumes are keyed on that name; a preset file of yours (ddp.yaml
copied as ddp4.yaml with other settings) is the built-in preset whose strategy class it keeps."""

import functools
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError

BUILT_IN = ("single", "ddp", "ddp_spawn", "dp", "fsdp", "model_parallel", "pipeline")
STRATEGY_CONFIGS = Path(__file__).parents[1] / "configs" / "strategy"


def strategy_class(strategy: Any) -> tuple[str, str | None]:
    """What tells the presets apart: the strategy's class (`_target_`, or a name: Lightning's `auto` for single) and
    its start method (Lightning's ddp_spawn is its DDPStrategy with start_method=spawn)."""
    if isinstance(strategy, DictConfig | dict):
        return str(strategy.get("_target_")), strategy.get("start_method")
    return str(strategy), None


@functools.cache
def built_in_classes() -> dict[tuple[str, str | None], str]:
    return {strategy_class(OmegaConf.load(STRATEGY_CONFIGS / f"{name}.yaml").strategy): name for name in BUILT_IN}


def built_in_preset(choice: str, strategy: Any) -> str:
    """`choice` (strategy=NAME) if it is a built-in preset, else the built-in preset with the same strategy class;
    a class none of them has is refused in one line (the template would not know how to launch or resume it)."""
    if choice in BUILT_IN:
        return choice
    found = built_in_classes().get(strategy_class(strategy))
    if found is None:
        target, start = strategy_class(strategy)
        given = target + (f" with start_method={start}" if start else "")
        raise ConfigError(
            f"strategy={choice}: its strategy ({given}) is none of the built-in presets' ({', '.join(BUILT_IN)}), "
            f"whose launch, checks and resumption this project knows: copy one of configs/strategy/ and keep its "
            f"_target_"
        )
    return found
