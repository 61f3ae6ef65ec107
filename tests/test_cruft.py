"""A generated project takes the template's later improvements with `cruft update` (the template's README says how):
baked with `cruft create` at one commit, the project's own edit and a template change to a shared file made after
it both end up in the project, with no rejected hunks. Real git repositories, a real cruft."""

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TEMPLATE

GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("cruft") is None, reason="cruft is not installed (requirements-dev.txt has it)")
@pytest.mark.skipif(not (TEMPLATE / ".git").exists(), reason="the template is not a git repository here")
def test_cruft_update_brings_a_template_change_and_keeps_the_projects_own(tmp_path):
    template = tmp_path / "template"
    run(["git", "clone", "-q", str(TEMPLATE), str(template)], tmp_path)  # its last commit
    created = run(["cruft", "create", "--no-input", str(template), "--output-dir", str(tmp_path)], tmp_path)
    assert "Next:" in created, "the next steps, for a new project"
    project = tmp_path / "scaled-trainer"
    run(["git", "init", "-q"], project)
    run([*GIT, "add", "-A"], project)
    run([*GIT, "commit", "-qm", "baked"], project)

    model = project / "src" / "scaled_trainer" / "models" / "mlp.py"  # the user's edit of a model file
    model.write_text(model.read_text().replace("hidden: int = 128", "hidden: int = 96"))
    assert "hidden: int = 96" in model.read_text()
    run([*GIT, "commit", "-qam", "a narrower model"], project)

    shared = (
        template / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}" / "data" / "loading.py"
    )
    improved = shared.read_text().replace('"""The one way every engine', '"""(improved) The one way every engine', 1)
    assert improved != shared.read_text()
    shared.write_text(improved)
    run([*GIT, "commit", "-qam", "a template improvement"], template)

    output = run(["cruft", "update", "--skip-apply-ask", "-y"], project)
    assert "updated" in output and "Next:" not in output, "no next steps for cruft's own temporary bakes"
    assert "hidden: int = 96" in model.read_text(), "the project's own edit is kept"
    assert (project / "src" / "scaled_trainer" / "data" / "loading.py").read_text().startswith('"""(improved)')
    assert not list(project.rglob("*.rej")), "no rejected hunks"
    assert run(["cruft", "check"], project)  # the project is now at the template's last commit
