"""Reject unusable answers before anything is generated.

Values arrive through Jinja's ``tojson``: each one becomes a JSON string literal,
which is also a valid Python string literal, so quotes, braces or newlines in an
answer can neither break this script nor inject code into it.
"""

import keyword
import re
import sys
import unicodedata
from pathlib import Path

ENGINE = {{ cookiecutter.engine | tojson }}
PROJECT_NAME = {{ cookiecutter.project_name | tojson }}
PROJECT_SLUG = {{ cookiecutter.project_slug | tojson }}
PACKAGE_NAME = {{ cookiecutter.package_name | tojson }}
WANDB_PROJECT = {{ cookiecutter.wandb_project | tojson }}
WANDB_ENTITY = {{ cookiecutter.wandb_entity | tojson }}
AUTHOR_EMAIL = {{ cookiecutter.author_email | tojson }}
# Free text, put in the project's files between quotes as it is (pyproject.toml, the package's docstring): tojson's
# escapes would write a character beyond U+FFFF (an emoji) as two halves, which TOML refuses.
FREE_TEXT = {
    "project_name": PROJECT_NAME,
    "description": {{ cookiecutter.description | tojson }},
    "author_name": {{ cookiecutter.author_name | tojson }},
    "author_email": AUTHOR_EMAIL,
}

# Names a generated package must not take: they would shadow what it or its tests import (its dependencies and
# extras, and the standard library with its `test` package).
DEPENDENCIES = {"torch", "lightning", "accelerate", "hydra", "omegaconf", "wandb", "rich", "pynvml", "matplotlib"}
DEPENDENCIES |= {"safetensors", "numpy", "tqdm", "yaml", "google", "lightning_utilities"}
EXTRAS = {"optuna", "submitit", "transformers", "torchao", "litdata", "torchmetrics", "pytest", "ruff", "tomli"}
# torch's own dependencies, and the modules of the project's tests (tests/ is on their path)
TORCH_NEEDS = {"sympy", "mpmath", "networkx", "jinja2", "filelock", "fsspec", "typing_extensions", "triton"}
# what the dependencies import in turn (hydra, wandb, lightning, matplotlib, optuna...): `packaging` failed every
# command inside Hydra, `pydantic` inside wandb, `click` on its first use
THEIR_NEEDS = {"packaging", "pydantic", "pydantic_core", "click", "requests", "psutil", "platformdirs", "six", "idna"}
THEIR_NEEDS |= {"antlr4", "certifi", "charset_normalizer", "urllib3", "httpx", "httpcore", "h11", "anyio", "sniffio"}
THEIR_NEEDS |= {"annotated_types", "typing_inspection", "setuptools", "markupsafe", "pygments", "markdown_it", "mdurl"}
THEIR_NEEDS |= {"PIL", "contourpy", "cycler", "dateutil", "fontTools", "kiwisolver", "pyparsing", "mpl_toolkits"}
THEIR_NEEDS |= {"alembic", "sqlalchemy", "mako", "colorlog", "cloudpickle", "huggingface_hub", "xxhash", "distro"}
THEIR_NEEDS |= {"lightning_fabric", "pytorch_lightning", "torchgen", "functorch", "opentelemetry", "truststore"}
THEIR_NEEDS |= {"regex", "attr", "attrs", "tabulate", "colorama", "opt_einsum", "zstandard", "lz4", "boto3", "botocore"}
TEST_MODULES = {"conftest", "layouts", "own_models", "custom_dataset", "fake_nvml", "forked", "hard_kill", "refusals"}
TEST_MODULES |= {"simulated_oom", "slurm_jobs", "wandb_records", "kill_switch", "engine_specific", "slow_start"}
TEST_MODULES |= {"failing_callback", "launchers", "nets", "oom_sim", "own_modules", "restarts", "shard_probe"}
TAKEN = set(sys.stdlib_module_names) | DEPENDENCIES | EXTRAS | TORCH_NEEDS | THEIR_NEEDS | TEST_MODULES
TAKEN |= {"test", "tests"}
# A file each engine alone puts in the package. cookiecutter -f bakes over an existing folder (the hook runs in it)
# and deletes nothing: over a project of the other engine, both engines' files were left mixed.
ENGINE_FILES = {"lightning": "engine/datamodule.py", "accelerate": "engine/loop.py"}
SLUG = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
WANDB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def problem() -> str | None:
    """The first unusable answer, described in one line, or None."""
    if not PROJECT_NAME.strip():
        return "project_name is empty; give a name such as 'Image Classifier'"
    for name, text in FREE_TEXT.items():
        if any(unicodedata.category(character) == "Cc" for character in text):
            return f"{name} has a control character (a line break, a tab?); give it on one line of plain text"
    if PROJECT_SLUG == "_":  # (cookiecutter.json's stand-in for a name that slugifies to nothing)
        return (
            "project_name has no letter or digit to name the project's folder after; "
            "give one that has, or a project_slug such as 'image-classifier'"
        )
    if not SLUG.fullmatch(PROJECT_SLUG):
        return (
            f"project_slug {PROJECT_SLUG!r} is not usable: it must be ASCII lowercase letters, digits and "
            "single '-', starting with a letter (e.g. 'image-classifier')"
        )
    if not (PACKAGE_NAME.isascii() and PACKAGE_NAME.isidentifier()) or PACKAGE_NAME[:1].isdigit():
        return f"package_name {PACKAGE_NAME!r} is not a Python identifier: use ASCII letters, digits and '_', not starting with a digit"
    if keyword.iskeyword(PACKAGE_NAME) or keyword.issoftkeyword(PACKAGE_NAME):
        return f"package_name {PACKAGE_NAME!r} is a Python keyword; choose another name"
    if PACKAGE_NAME in TAKEN:
        return f"package_name {PACKAGE_NAME!r} would shadow the module of the same name; choose another name"
    if PACKAGE_NAME.startswith("test_"):  # (the tests import test modules of theirs by name: test_config, ...)
        return f"package_name {PACKAGE_NAME!r} would shadow the tests' test_* modules; choose a name not starting with 'test_'"
    if not WANDB_NAME.fullmatch(WANDB_PROJECT):
        return f"wandb_project {WANDB_PROJECT!r} is not usable: use letters, digits, '_', '-' and '.'"
    if WANDB_ENTITY and not WANDB_NAME.fullmatch(WANDB_ENTITY):
        return f"wandb_entity {WANDB_ENTITY!r} is not usable: leave it empty or use letters, digits, '_', '-' and '.'"
    if AUTHOR_EMAIL and not re.fullmatch(r"[^@\s\"]+@[^@\s\"]+", AUTHOR_EMAIL):
        return f"author_email {AUTHOR_EMAIL!r} is not an e-mail address"
    if other := next((name for name, file in ENGINE_FILES.items() if Path("src", PACKAGE_NAME, file).is_file()), None):
        if other != ENGINE:
            return (
                f"{Path.cwd()} holds this project baked with engine={other}: baking engine={ENGINE} over it would "
                f"leave the {other} engine's files beside the new ones (cookiecutter deletes none); bake into a new "
                "folder, or remove this one first"
            )
    return None


if __name__ == "__main__":
    message = problem()
    if message:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)
