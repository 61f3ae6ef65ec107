"""The docs pages "Bring your own data" (docs/your-data.md) and "Bringing your own model and data"
(docs/your-model.md), followed step by step: their code blocks as written, in order, in a fresh folder. A Python
block that starts with `# <name>.py` is a module the reader saves under that name; any other one is run."""

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import PACKAGE
from forked import python_on_path
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from wandb_records import offline_runs

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.parallel.sharding import check_tensor_parallel
from {{ cookiecutter.package_name }}.parallel.split import find_split, pipeline_stage

DOCS = Path(__file__).parents[1] / "docs"


def section_blocks(page: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block of the docs page, in order (a list item's dedented)."""
    text = (DOCS / page).read_text()
    blocks = re.findall(r"^( *)```(\w+)\n(.*?)^ *```", text, flags=re.DOTALL | re.MULTILINE)
    return [(language, textwrap.dedent(code)) for _, language, code in blocks]


def saved_as(code: str) -> str | None:
    """The file name a module block names on its first line (`# my_pkg.py`), or None for a block to run."""
    first = code.splitlines()[0]
    return first[2:] if re.fullmatch(r"# \w+\.py", first) else None


@pytest.mark.slow
def test_bring_your_own_data_as_the_docs_say(tmp_path, train_env):
    pytest.importorskip("litdata", reason="data=streaming needs litdata (docs/your-data.md)")
    blocks = section_blocks("your-data.md")
    assert [language for language, _ in blocks] == ["python", "bash", "python", "bash", "bash"], (
        "the files, a Dataset class, then the streaming steps"
    )
    env = {**train_env, "PYTHONPATH": f"{train_env['PYTHONPATH']}:{tmp_path}"}  # as `python -m` from there would
    env = python_on_path(env, preload=f"{PACKAGE}.train")  # CI time: the commands' `python -m` forked
    for language, code in blocks:
        if name := saved_as(code):
            (tmp_path / name).write_text(code)
            continue
        command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{code}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"

    runs = sorted((tmp_path / "outputs").rglob("config.yaml"), key=lambda path: path.stat().st_mtime)
    assert len(runs) == 3, "the files training, the Dataset class's, then the streamed one"
    for config in runs:
        (run,) = offline_runs(config.parent)
        assert run.metric("val/loss"), f"{config.parent} validated"
        assert (run.config["data"]["num_features"], run.config["data"]["num_classes"]) == (784, 10)
    assert offline_runs(runs[1].parent)[0].config["data"]["dataset"]["_target_"] == "my_pkg.MyDataset"
    assert (tmp_path / "data-streamed" / "shapes.json").is_file()


def test_bring_your_own_model_as_the_docs_say(tmp_path, monkeypatch):
    """The model of your own, saved as the README says, and its command's overrides: they build it, and its Split
    passes what model_parallel and pipeline check before training (in this process: no training)."""
    [(_, module), (_, command)] = section_blocks("your-model.md")
    (tmp_path / saved_as(module)).write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = shlex.split(command.replace("\\\n", " ").split(".train", 1)[1])
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    net = instantiate(cfg.model.net)
    assert find_split(net, "pipeline")[0] is net
    check_tensor_parallel(net, 2)  # the plan names real layers, and their features divide over 2 ranks
    x = torch.randn(4, cfg.data.num_features)
    stages = [pipeline_stage(net, stage, 2) for stage in range(2)]
    assert torch.equal(stages[1](stages[0](x)), net(x)), "the Split runs the net's forward"
