"""Helpers for the template's tests: the template's choices and an environment for baked projects."""

import itertools
import json
import os
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]
CONTEXT = json.loads((TEMPLATE / "cookiecutter.json").read_text())
CHOICES = {name: values for name, values in CONTEXT.items() if isinstance(values, list)}


# The choices whose files interact (the engine's overlay holds the strategy presets): every pair of them. Each other
# choice takes its values in turn over those pairs, so that every value of every choice is baked, with each engine.
# (Every combination, 56 bakes, took 80 s of CI time to repeat what the pairs check: python_version is one line.)
INTERACTING = ("engine", "default_strategy")


def every_choice():
    """One extra_context per pair of the interacting choices, the others' values in turn."""
    others = [name for name in CHOICES if name not in INTERACTING]
    for index, values in enumerate(itertools.product(*(CHOICES[name] for name in INTERACTING))):
        yield dict(zip(INTERACTING, values)) | {name: CHOICES[name][index % len(CHOICES[name])] for name in others}


def project_env(project: Path, home: Path) -> dict[str, str]:
    """Run a baked project from its folder without installing it; wandb offline in a temp dir."""
    env = dict(os.environ, PYTHONPATH=str(project / "src"), WANDB_MODE="offline", WANDB_DIR=str(home))
    env.update(WANDB_CACHE_DIR=str(home / "cache"), WANDB_CONFIG_DIR=str(home / "config"))
    env.pop("WANDB_API_KEY", None)
    env.setdefault("OMP_NUM_THREADS", "1")  # several trainings at a time: one thread each (the baked conftest's why)
    return env


@pytest.fixture
def bake(cookies):
    """bake(**answers) -> path of the baked project; fails the test if baking fails."""

    def run(**answers):
        result = cookies.bake(extra_context=answers)
        assert result.exit_code == 0, result.exception
        return Path(result.project_path)

    return run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The baked suites first: pytest-xdist hands tests out in this order, so each starts at once on a worker of
    its own and the short tests fill in around them."""
    items.sort(key=lambda item: "passes_its_own_test_suite" not in item.name)  # stable: the rest keep their order
