"""The baked project passes its own checks: lint, packaging, and its whole test suite."""

import re
import subprocess
import sys
import zipfile

import pytest
from conftest import CHOICES, project_env


def run(command: list[str], project, tmp_path, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        check=False,
        cwd=project,
        env=project_env(project, tmp_path / "wandb"),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def passed_count(output: str) -> int:
    """Tests pytest reports as passed; 0 when it ran none (which must fail, not pass silently)."""
    summary = output.strip().splitlines()[-1]
    match = re.search(r"(\d+) passed", summary)
    assert match and "failed" not in summary and "error" not in summary, output[-6000:]
    return int(match.group(1))


def test_generated_project_passes_its_own_test_suite(bake, tmp_path):
    project = bake()
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert passed_count(result.stdout) >= 20


def test_generated_project_is_lint_clean(bake, tmp_path):
    project = bake()
    for check in (["check"], ["format", "--check"]):
        result = run([sys.executable, "-m", "ruff", *check, "--no-cache", "."], project, tmp_path)
        assert result.returncode == 0, result.stdout


def test_generated_project_builds_a_wheel_with_its_configs(bake, tmp_path):
    project = bake()
    result = run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        project,
        tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [wheel] = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "scaled_trainer/train.py" in names
    assert "scaled_trainer/configs/train.yaml" in names
    assert "scaled_trainer/configs/strategy/ddp.yaml" in names


def test_readme_install_keeps_the_installed_torch(bake, tmp_path):
    """With torch==2.13.0 installed first (the README's first step), installing the project pulls no other build."""
    project = bake()
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "-e", ".[dev]"]
    result = run(command, project, tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [would_install] = [line for line in result.stdout.splitlines() if line.startswith("Would install")]
    assert would_install == "Would install scaled-trainer-0.1.0"


@pytest.mark.parametrize("strategy", [s for s in CHOICES["default_strategy"] if s != CHOICES["default_strategy"][0]])
def test_other_default_strategies_compose(bake, tmp_path, strategy):
    project = bake(default_strategy=strategy)
    result = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", "not bad_input"],
        project,
        tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:]
    assert passed_count(result.stdout) >= 5
