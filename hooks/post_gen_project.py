"""Keep the chosen engine's training code, drop the other's, print the next steps. Never prompts."""

import shutil
from pathlib import Path

ENGINE = {{ cookiecutter.engine | tojson }}
PROJECT_SLUG = {{ cookiecutter.project_slug | tojson }}
PACKAGE_NAME = {{ cookiecutter.package_name | tojson }}
DEFAULT_STRATEGY = {{ cookiecutter.default_strategy | tojson }}

# _engines/<engine>/ mirrors the project tree: its files join the shared ones (model, data, configs, ...).
engines = Path("_engines")
shutil.copytree(engines / ENGINE, ".", dirs_exist_ok=True)
shutil.rmtree(engines)

# The README's quick start: Accelerate's presets of several processes need its launcher (ddp_spawn: their number).
train = f"python -m {PACKAGE_NAME}.train"
launch = f"accelerate launch --config_file launch/multi_process.yaml -m {PACKAGE_NAME}.train"
if ENGINE == "accelerate":
    multi = f"{launch} strategy=ddp"
    if DEFAULT_STRATEGY in ("ddp", "fsdp", "model_parallel", "pipeline"):
        train = launch
    elif DEFAULT_STRATEGY == "ddp_spawn":
        train += " trainer.devices=2"
else:
    multi = f"{train} strategy=ddp trainer.devices=2"
print(
    f"""
Created {PROJECT_SLUG}/ ({ENGINE} engine). Next:

  cd {PROJECT_SLUG}
  pip install torch==2.13.0 && pip install -e '.[dev]' && {train}
  {multi}
  pytest

(On a GPU machine, install the torch build for your CUDA version instead of the pinned CPU wheel.)
"""
)
