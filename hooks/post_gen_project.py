"""Print the next steps. Never prompts: the template must bake without a terminal."""

PROJECT_SLUG = {{ cookiecutter.project_slug | tojson }}
PACKAGE_NAME = {{ cookiecutter.package_name | tojson }}

print(
    f"""
Created {PROJECT_SLUG}/. Next:

  cd {PROJECT_SLUG}
  pip install torch==2.13.0 && pip install -e '.[dev]' && python -m {PACKAGE_NAME}.train
  pytest

(On a GPU machine, install the torch build for your CUDA version instead of the pinned CPU wheel.)
"""
)
