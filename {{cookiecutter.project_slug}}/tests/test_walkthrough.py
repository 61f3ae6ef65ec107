"""The README's "Bring your own data" section, followed step by step: its code blocks run in order, as written, in
a fresh folder (the one that needs a Dataset class of your own, `my_pkg`, is tests/test_files_data.py's)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_records import offline_runs

README = Path(__file__).parents[1] / "README.md"


def section_blocks(title: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block of the README section `title`, in order."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```(\w+)\n(.*?)```", text[start:end], flags=re.DOTALL)


@pytest.mark.slow
def test_bring_your_own_data_as_the_readme_says(tmp_path, train_env):
    pytest.importorskip("litdata", reason="data=streaming needs litdata: pip install -e '.[streaming]'")
    blocks = [(language, code) for language, code in section_blocks("Bring your own data") if "my_pkg" not in code]
    assert [language for language, _ in blocks] == ["python", "bash", "bash"], "the files and streaming steps"
    for language, code in blocks:
        command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
        done = subprocess.run(command, cwd=tmp_path, env=train_env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{code}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"

    runs = sorted((tmp_path / "outputs").rglob("config.yaml"), key=lambda path: path.stat().st_mtime)
    assert len(runs) == 2, "the files training, then the streamed one"
    for config in runs:
        (run,) = offline_runs(config.parent)
        assert run.metric("val/loss"), f"{config.parent} validated"
        assert (run.config["data"]["num_features"], run.config["data"]["num_classes"]) == (784, 10)
    assert (tmp_path / "data-streamed" / "shapes.json").is_file()
