"""The template's own Python, both engines' overlays included, is plain Python that ruff passes (no Jinja block)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = [sys.executable, str(REPO / "scripts" / "lint_template.py")]


def test_the_template_passes_ruff_without_baking():
    result = subprocess.run(LINT, check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize(
    "change, finding",
    [
        ('{% if cookiecutter.engine == "lightning" %}\nX = 1\n{% endif %}\n', "Jinja blocks"),
        ("import textwrap\n", "F401"),  # unused: ruff sees the file
    ],
)
def test_a_finding_fails_the_lint(tmp_path, change, finding):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "{{cookiecutter.project_slug}}", copy / "{{cookiecutter.project_slug}}")
    shutil.copytree(REPO / "scripts", copy / "scripts")
    module = copy / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}" / "errors.py"
    module.write_text(module.read_text() + change)
    result = subprocess.run(
        [sys.executable, str(copy / "scripts" / "lint_template.py")], check=False, capture_output=True, text=True
    )
    assert result.returncode == 1 and finding in result.stdout, result.stdout[-3000:]
