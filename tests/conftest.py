"""Helpers for the template's tests: the template's choices and an environment for baked projects."""

import itertools
import json
import os
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]
CONTEXT = json.loads((TEMPLATE / "cookiecutter.json").read_text())
CHOICES = {name: values for name, values in CONTEXT.items() if isinstance(values, list)}


def every_choice():
    """One extra_context per combination of the template's choice variables."""
    for values in itertools.product(*CHOICES.values()):
        yield dict(zip(CHOICES, values))


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
