"""The package's house rules, read from its source: the tree the README shows is the package's, imports point
down only (counting imports inside functions), and there is no import cycle."""

import ast
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "{{ cookiecutter.package_name }}"
README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = ("train", "doctor", "bench", "search")
# From the top down: a module may import its own layer and the ones below it, never one above.
LAYERS = [
    {"train", "doctor", "bench", "search"},
    {"tools"},
    {"engine"},
    {"config"},
    {"parallel", "models", "data", "runtime", "tracking"},
    {"errors", ""},  # "": the package's __init__, which imports none of it
]


def module_names() -> dict[str, Path]:
    """Dotted name (relative to the package) of every module: "" for the package, "data.loading", ..."""
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (top level or inside functions)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
        elif isinstance(node, ast.ImportFrom | ast.Import) and not getattr(node, "level", 0):
            modules = [node.module] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
            base = next((m.split(".")[1:] for m in modules if m and m.split(".")[0] == PACKAGE_DIR.name), None)
            if base is None:
                continue
        else:
            continue
        target = ".".join(base)
        submodules = [f"{target}.{alias.name}".lstrip(".") for alias in getattr(node, "names", [])]
        found |= {module for module in submodules if module in known} or {target}
    return found - {name}


def graph() -> dict[str, set[str]]:
    names = module_names()
    return {name: imports_of(name, path, set(names)) for name, path in names.items()}


def layer(module: str) -> int:
    top = module.split(".")[0]
    return next(index for index, names in enumerate(LAYERS) if top in names)


def test_imports_point_down_only():
    upward = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module
        for target in targets
        if target and layer(target) < layer(module)
    ]
    assert not upward, upward


def test_training_never_imports_a_command():
    for module, targets in graph().items():
        if module and module.split(".")[0] not in COMMANDS:
            assert not {target for target in targets if target.split(".")[0] in COMMANDS}, module


def test_no_import_cycle():
    edges = graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for target in edges.get(module, ()):
            visit(target, [*path, module])
        done.add(module)

    for module in edges:
        visit(module, [])


def test_the_readme_tree_is_the_package():
    section = README.read_text().split("## Where things live", 1)[1]
    block = section.split("```", 2)[1]
    shown = set(re.findall(r"^  (\S+)", block, re.MULTILINE))
    actual = {f"{path.name}/" for path in PACKAGE_DIR.iterdir() if path.is_dir() and path.name != "__pycache__"}
    actual |= {path.name for path in PACKAGE_DIR.glob("*.py") if path.name != "__init__.py"}
    assert shown == actual
    assert len(list(PACKAGE_DIR.glob("*.py"))) <= 8, "at most 8 modules at the package root"
