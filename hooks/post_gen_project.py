"""Keep the chosen engine's training code, drop the other's, print the next steps. Never prompts."""

import os
import shutil
from pathlib import Path

ENGINE = {{ cookiecutter.engine | tojson }}
PROJECT_SLUG = {{ cookiecutter.project_slug | tojson }}
PACKAGE_NAME = {{ cookiecutter.package_name | tojson }}

# _engines/<engine>/ mirrors the project tree: its files join the shared ones (model, data, configs, ...).
engines = Path("_engines")
shutil.copytree(engines / ENGINE, ".", dirs_exist_ok=True)
shutil.rmtree(engines)

# The training line of the generated README's quick start (a default preset of several processes launches them)
readme = Path("README.md").read_text()
[train] = [line.split("#")[0].strip() for line in readme.splitlines() if "# trains the default model" in line]
if ENGINE == "accelerate":
    multi = f"accelerate launch --config_file launch/multi_process.yaml -m {PACKAGE_NAME}.train strategy=ddp"
else:
    multi = f"python -m {PACKAGE_NAME}.train strategy=ddp trainer.devices=2"

def for_a_comparison() -> bool:
    """Whether cruft update, diff or check baked this, into a temporary folder to compare with the project (Linux:
    the parent process's command line): the next steps below are for a new project only."""
    try:
        args = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:  # (no /proc: said, as before)
        return False
    cruft = any(Path(arg.decode(errors="replace")).name == "cruft" for arg in args[:2])
    return cruft and any(arg in (b"update", b"diff", b"check") for arg in args)


if for_a_comparison():
    raise SystemExit(0)
# The project's folder from where cookiecutter was run (the hook runs inside the project; the shell's PWD stays):
# `-o DIR` puts it in DIR/<slug>, and a bare `cd <slug>` led nowhere. Absolute when it is not below that folder.
here = Path.cwd()
shown = os.path.relpath(here, os.environ["PWD"]) if os.environ.get("PWD") else str(here)  # (no shell: no PWD)
if shown.startswith(".."):
    shown = str(here)
print(
    f"""
Created {shown}/ ({ENGINE} engine). Next:

  cd {shown}
  pip install torch==2.13.0 && pip install -e '.[dev]' && {train}
  {multi}
  pytest -m "not slow"   # the fast tests; all of them: pytest -n 2 --dist loadfile (docs/tests.md)

(On a GPU machine, install the torch build for your CUDA version; on a CPU-only one, torch from
https://download.pytorch.org/whl/cpu: plain PyPI gives the CUDA build on Linux.)
"""
)
