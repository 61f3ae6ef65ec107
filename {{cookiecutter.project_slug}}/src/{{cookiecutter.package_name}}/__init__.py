{{ '"' ~ (cookiecutter.project_name ~ ': ' ~ cookiecutter.description) | replace('\\', '\\\\') | replace('"', '\\"') ~ '"' }}

import os

# Read first thing, before the package's imports (seconds on a busy machine): the process that started this one,
# torchrun's agent for a worker, which must die with it (parallel/launcher.py, die_with_launcher).
STARTED_BY = os.getppid()
