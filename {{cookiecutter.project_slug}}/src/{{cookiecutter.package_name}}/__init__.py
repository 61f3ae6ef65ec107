{{ '"' ~ (cookiecutter.project_name ~ ': ' ~ cookiecutter.description) | replace('\\', '\\\\') | replace('"', '\\"') ~ '"' }}

import os

# Read first thing, before the package's imports (seconds on a busy machine): this process and the one that started
# it, torchrun's agent for a worker, which must die with it (parallel/launcher.py, die_with_launcher).
IMPORTED_IN, STARTED_BY = os.getpid(), os.getppid()
