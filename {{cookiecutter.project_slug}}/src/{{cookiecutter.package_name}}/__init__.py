{{ '"' ~ (cookiecutter.project_name ~ ': ' ~ cookiecutter.description) | replace('\\', '\\\\') | replace('"', '\\"') ~ '"' }}
