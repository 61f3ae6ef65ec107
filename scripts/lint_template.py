"""Lint the template's own Python, both engines' overlays included, without baking: `python scripts/lint_template.py
[--fix]`.

Every .py file of the project template must be plain Python apart from `{{ ... }}` substitutions (no `{% %}`
block: engine differences live in the _engines/<engine>/ overlay). Each substitution is replaced by a placeholder
name, ruff (with the generated project's settings) checks the copies, and --fix writes ruff's fixes back with the
substitutions restored. Exit 1 on a finding.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "{{cookiecutter.project_slug}}"
PACKAGE_DIR = "{{cookiecutter.package_name}}"
NAMED = {  # substitution -> placeholder; their reverse restores a fixed file exactly
    "{{ cookiecutter.package_name }}": "package_name",
    "{{ cookiecutter.engine }}": "cookiecutter_engine",
    "{{ cookiecutter.default_strategy }}": "cookiecutter_default_strategy",
}
SUBSTITUTION = re.compile(r"\{\{.*?\}\}")
RUFF_SETTINGS = """line-length = 120
target-version = "py311"
[lint]
select = ["E", "F", "I", "UP", "B"]
[lint.isort]
known-first-party = ["package_name"]
"""


def template_files() -> list[Path]:
    return sorted(path for path in TEMPLATE.rglob("*.py") if "__pycache__" not in path.parts)


def to_python(text: str, others: dict[str, str]) -> str:
    for substitution, name in NAMED.items():
        text = text.replace(substitution, name)

    def placeholder(match: re.Match) -> str:  # any other substitution, e.g. the package docstring's
        return others.setdefault(match.group(0), f'"__substitution_{len(others)}__"')

    return SUBSTITUTION.sub(placeholder, text)


def to_template(text: str, others: dict[str, str]) -> str:
    for substitution, placeholder in others.items():
        text = text.replace(placeholder, substitution)
    for substitution, name in NAMED.items():
        text = re.sub(rf"\b{name}\b", substitution, text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="write ruff's fixes and formatting back to the template")
    fix = parser.parse_args().fix
    blocks = [str(path.relative_to(REPO)) for path in template_files() if "{%" in path.read_text()]
    if blocks:
        print("Jinja blocks ({%) in .py files; move engine differences to _engines/<engine>/:", *blocks, sep="\n  ")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        copies, others = {}, {}
        for path in template_files():
            copy = Path(tmp) / str(path.relative_to(TEMPLATE)).replace(PACKAGE_DIR, "package_name")
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(to_python(path.read_text(), others))
            copies[copy] = path
        (Path(tmp) / "ruff.toml").write_text(RUFF_SETTINGS)
        ruff = [sys.executable, "-m", "ruff"]
        if fix:
            subprocess.run([*ruff, "check", "--fix", "--no-cache", "--quiet", "."], cwd=tmp, check=False)
            subprocess.run([*ruff, "format", "--no-cache", "--quiet", "."], cwd=tmp, check=True)
            for copy, path in copies.items():
                fixed = to_template(copy.read_text(), others)
                if fixed != path.read_text():
                    path.write_text(fixed)
        checks = [[*ruff, "check", "--no-cache", "."], [*ruff, "format", "--check", "--no-cache", "."]]
        failed = [subprocess.run(command, cwd=tmp, check=False).returncode for command in checks]
    return 1 if any(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
