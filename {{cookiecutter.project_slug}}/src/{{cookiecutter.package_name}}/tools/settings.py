"""Checks of the doctor's and the bench's own settings (doctor.*, bench.*), made before anything is measured or
written: a bad value is a ConfigError, one line that names the setting, the value as given and what is valid.

The command line's type check (config/settings.py) knows a setting's type from its default only: a list, or a setting
whose default is null, takes any value there, and is checked here. A bare number where a list is wanted
(`bench.devices=2`) is refused with the list to give instead (`[2]`): no setting of the template takes one as a list.
"""

import math
from typing import Any

from omegaconf import DictConfig, ListConfig

from ..errors import ConfigError


def shown(value: Any) -> str:
    """A value as it is given on the command line: `[1,2]`, `abc`, `null`."""
    if isinstance(value, list | ListConfig):
        return f"[{','.join(shown(item) for item in value)}]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def settings_group(name: str, node: Any, example: str) -> None:
    """Refuse `doctor=null` or `doctor.allreduce=5`: one value given to a group of settings (an AttributeError's
    traceback when it was read)."""
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{name}={shown(node)}: {name} is a group of settings; give them one by one, e.g. {example}")


def is_number(value: Any) -> bool:
    """An int or a float that is finite; not a bool (true is an int to Python), not text."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def whole_number(key: str, value: Any, minimum: int, what: str) -> int:
    """`value` if it is a whole number >= minimum; else a ConfigError. `what`: what the setting is, in brackets."""
    if not (is_whole(value) and value >= minimum):
        raise ConfigError(f"{key}={shown(value)} must be a whole number >= {minimum} ({what})")
    return value


def number(key: str, value: Any, minimum: float, what: str, above: bool = False) -> float:
    """`value` if it is a number >= minimum (> minimum with `above`); else a ConfigError."""
    if not (is_number(value) and (value > minimum if above else value >= minimum)):
        raise ConfigError(f"{key}={shown(value)} must be a number {'>' if above else '>='} {minimum:g} ({what})")
    return value


def number_list(
    key: str,
    value: Any,
    what: str,
    example: str,
    whole: bool,
    minimum: float,
    above: bool = False,
    empty: bool = True,
) -> list:
    """`value` as a list if it lists numbers (whole ones with `whole`) >= minimum (> minimum with `above`), or
    none if `empty`; else a ConfigError saying `<key>=<value> must list <what> <bound>, e.g. <example>`, and for
    a bare number the list to give instead."""
    bound = f"{'>' if above else '>='} {minimum:g}"
    refusal = f"{key}={shown(value)} must list {what} {bound}, e.g. {example}"
    if is_number(value):  # one number: a list of it is what was meant
        raise ConfigError(f"{refusal}; give a list: [{shown(value)}]")
    if not isinstance(value, list | ListConfig) or not (value or empty):
        raise ConfigError(refusal)
    for item in value:
        if not ((is_whole(item) if whole else is_number(item)) and (item > minimum if above else item >= minimum)):
            raise ConfigError(refusal)
    return list(value)
