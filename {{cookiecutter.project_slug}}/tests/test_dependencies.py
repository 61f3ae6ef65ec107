"""Every package the source imports is one pyproject.toml declares (a dependency, or an extra's), so that
`pip install -e .` in a fresh environment runs it: one that only arrives with another package (safetensors with
accelerate, not with Lightning) is missing where that one is not installed, and the development environment,
which has everything, never shows it."""

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (a project baked for it): the same parser, as tomli (the dev extra's)
    import tomli as tomllib

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = PROJECT / "src" / "{{ cookiecutter.package_name }}"
# installed with --no-deps by the step docs/your-data.md gives (its own dependencies are the `streaming` extra)
NOT_AN_EXTRA = {"litdata"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + sum(project.get("optional-dependencies", {}).values(), [])
    return {normalized(re.match(r"[A-Za-z0-9._-]+", requirement).group()) for requirement in requirements}


def imported() -> dict[str, Path]:
    """The top-level name of every module outside the package and the standard library that the source imports
    (at the top of a file or inside a function), with a file that imports it."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names}:
                if top not in sys.stdlib_module_names and top != PACKAGE_DIR.name:
                    found.setdefault(top, path)
    return found


def test_every_imported_package_is_declared():
    distributions = packages_distributions()  # import name -> the installed distributions that provide it
    missing = {
        module: path.relative_to(PROJECT)
        for module, path in imported().items()
        # an import name provided by several distributions (google: protobuf's and others'): one of them will do
        if not {normalized(name) for name in distributions.get(module, [module])} & (declared() | NOT_AN_EXTRA)
    }
    assert not missing, "imported but not declared in pyproject.toml: " + ", ".join(
        f"{module} ({path})" for module, path in sorted(missing.items())
    )
