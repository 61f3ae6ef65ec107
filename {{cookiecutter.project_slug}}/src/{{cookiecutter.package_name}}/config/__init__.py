"""Hydra glue shared by every command, one job per module: `command_line` (run_cli: a command's start, its flags
and its one-line refusals), `overrides` (the command line's settings checked against the composed config), `settings`
(one setting against the config: its key, type, and whether anything reads it), `groups` (the presets of each config
group), `objects` (the resolvers the YAML files use, and building objects from configs with one-line errors)."""

from pathlib import Path

CONFIG_DIR = Path(__file__).parent.parent / "configs"
