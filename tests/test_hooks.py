"""The pre-generation hook: unusable answers stop the bake with one line; hostile ones cannot inject."""

import ast
import re
import subprocess
import sys

import pytest
from conftest import TEMPLATE

REJECTED = [
    ({"project_name": "   "}, "project_name is empty"),
    ({"project_name": "!!!"}, "project_name has no letter or digit"),  # (it baked into the output folder itself)
    ({"project_name": "🚀"}, "project_name has no letter or digit"),
    ({"project_name": "3D Net"}, "project_slug '3d-net' is not usable"),
    ({"project_name": "Class"}, "package_name 'class' is a Python keyword"),
    ({"project_name": "Match"}, "package_name 'match' is a Python keyword"),
    ({"project_name": "Logging"}, "package_name 'logging' would shadow"),
    ({"project_name": "Torch"}, "package_name 'torch' would shadow"),
    ({"project_name": "Accelerate", "engine": "accelerate"}, "package_name 'accelerate' would shadow"),
    ({"project_name": "Optuna"}, "package_name 'optuna' would shadow"),
    ({"project_name": "Safetensors"}, "package_name 'safetensors' would shadow"),
    ({"project_name": "Sympy"}, "package_name 'sympy' would shadow"),  # (torch's: torch's import failed)
    ({"project_name": "Packaging"}, "package_name 'packaging' would shadow"),  # (Hydra's: every command failed)
    ({"project_name": "Pydantic"}, "package_name 'pydantic' would shadow"),  # (wandb's)
    ({"project_name": "Layouts"}, "package_name 'layouts' would shadow"),  # (the tests': they failed to collect)
    ({"project_name": "Test"}, "package_name 'test' would shadow"),
    ({"project_name": "Test Config"}, "package_name 'test_config' would shadow the tests' test_* modules"),
    ({"project_slug": "café-net"}, "project_slug 'café-net' is not usable"),
    ({"package_name": "my-pkg"}, "package_name 'my-pkg' is not a Python identifier"),
    ({"package_name": "pkg\"); import os; os.system('touch /tmp/pwned'); (\""}, "is not a Python identifier"),
    ({"wandb_project": "has space"}, "wandb_project 'has space' is not usable"),
    ({"author_email": "nobody"}, "author_email 'nobody' is not an e-mail address"),
    # (TOML's strings and the package's docstring take no line break)
    ({"description": "two\nlines"}, "description has a control character"),
    ({"author_name": "Ada\tLovelace"}, "author_name has a control character"),
]


def bake_cli(tmp_path, *flags: str, **answers) -> subprocess.CompletedProcess:
    """The real command line a user runs, without a terminal (`flags`: cookiecutter's, e.g. -f)."""
    args = [f"{key}={value}" for key, value in answers.items()]
    return subprocess.run(
        [sys.executable, "-m", "cookiecutter", "--no-input", *flags, "-o", str(tmp_path), str(TEMPLATE), *args],
        check=False,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


@pytest.mark.parametrize("answers, message", REJECTED, ids=[m.split("'")[0].strip() or m for _, m in REJECTED])
def test_unusable_answers_stop_the_bake(tmp_path, answers, message):
    out = tmp_path / "out"
    result = bake_cli(out, **answers)
    assert result.returncode != 0
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "SyntaxError" not in result.stderr
    assert not out.exists() or not any(out.rglob("*")), "nothing may be generated"


def test_a_bake_over_a_project_of_the_other_engine_is_refused_and_deletes_nothing(tmp_path):
    """cookiecutter -f writes over an existing folder and deletes nothing: the other engine's files stayed."""
    assert bake_cli(tmp_path, engine="lightning").returncode == 0
    [project] = tmp_path.iterdir()
    before = sorted(project.rglob("*"))
    other = bake_cli(tmp_path, "-f", engine="accelerate")
    assert other.returncode != 0
    assert other.stderr.startswith(f"error: {project} holds this project baked with engine=lightning: baking engine=")
    assert sorted(project.rglob("*")) == before, "the project as it was"
    again = bake_cli(tmp_path, "-f", engine="lightning")  # the same engine again: cookiecutter's own overwrite
    assert again.returncode == 0, again.stderr


def test_a_long_project_name_gives_a_folder_name_of_64_characters_at_most(tmp_path):
    """A name of 250+ characters failed in cookiecutter (the folder's name too long for the file system)."""
    result = bake_cli(tmp_path / "out", project_name=" ".join(["Verylongword"] * 30))
    assert result.returncode == 0, result.stderr
    [project] = (tmp_path / "out").iterdir()
    assert project.name == "-".join(["verylongword"] * 5)


def test_hostile_project_name_cannot_inject(tmp_path):
    marker = tmp_path / "pwned"
    hostile = f'a"; open("{marker}", "w") #{{x}}'
    result = bake_cli(tmp_path / "out", project_name=hostile)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "the answer was executed as code"
    [project] = (tmp_path / "out").iterdir()
    assert project.name.startswith("a-open-tmp-")
    assert hostile in (project / "README.md").read_text()


def test_every_module_of_the_projects_tests_is_a_name_the_bake_refuses():
    """A package named as one of the tests' helper modules (tests/ is on their path) broke their collection."""
    hook = (TEMPLATE / "hooks" / "pre_gen_project.py").read_text()
    project = TEMPLATE / "{{cookiecutter.project_slug}}"
    folders = [project / "tests", *(project / "_engines").glob("*/tests")]
    helpers = {path.stem for folder in folders for path in folder.glob("*.py") if not path.stem.startswith("test_")}
    assert helpers and not [name for name in sorted(helpers) if f'"{name}"' not in hook]


def test_every_package_the_project_imports_is_a_name_the_bake_refuses():
    """The hook's list of dependencies is kept by hand: a package the source or tests came to import (safetensors)
    and the list did not name let a project take its name and shadow it."""
    hook = (TEMPLATE / "hooks" / "pre_gen_project.py").read_text()
    imported = set()
    for path in (TEMPLATE / "{{cookiecutter.project_slug}}").rglob("*.py"):
        # (Jinja's statements out, its expressions as a name: the files are templates)
        code = re.sub(r"\{\{.*?\}\}", "package", re.sub(r"\{%.*?%\}", "", path.read_text()))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.add(node.module.split(".")[0])
    outside = {name for name in imported - set(sys.stdlib_module_names) if name != "package"}
    assert {"torch", "safetensors", "conftest"} <= outside  # (the walk found the imports)
    unlisted = sorted(name for name in outside if f'"{name}"' not in hook and not name.startswith("test_"))
    assert not unlisted, f"imported by the project but not refused as a package name: {unlisted}"
