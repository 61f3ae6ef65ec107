"""`python -m {{ cookiecutter.package_name }}.bench scaling`: real trainings at 1 and 2 gloo processes on the CPU."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from wandb_records import offline_runs

PACKAGE = "{{ cookiecutter.package_name }}"
PROJECT = Path(__file__).resolve().parent.parent  # the launchers' configs (launch/) are relative to it
TINY = [
    "trainer.accelerator=cpu",
    "model.net.hidden=32",
    "model.net.depth=2",
    "data.batch_size=32",
    "bench.warmup_steps=2",
    "bench.steps=3",
]

pytestmark = pytest.mark.slow  # each point is a training


def bench(tmp_path: Path, env: dict[str, str], *overrides: str) -> tuple[Path, list[dict[str, str]]]:
    run_dir = tmp_path / "bench"
    command = [sys.executable, "-m", f"{PACKAGE}.bench", "scaling", f"hydra.run.dir={run_dir}", *TINY, *overrides]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=PROJECT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"bench: wrote {run_dir / 'scaling.csv'} and {run_dir / 'scaling.png'}" in proc.stdout
    with (run_dir / "scaling.csv").open() as file:
        return run_dir, list(csv.DictReader(file))


def test_ddp_weak_scaling(tmp_path, train_env):
    run_dir, rows = bench(tmp_path, train_env, "strategy=ddp", "bench.devices=[1,2]")

    assert [int(row["devices"]) for row in rows] == [1, 2]
    assert [int(row["global_batch"]) for row in rows] == [32, 64]  # weak scaling: 32 samples per process
    one, two = (float(row["samples_per_s"]) for row in rows)
    for row in rows:
        assert float(row["samples_per_s"]) == pytest.approx(int(row["global_batch"]) / (float(row["step_ms"]) / 1e3))
        assert float(row["efficiency"]) == pytest.approx(
            float(row["samples_per_s"]) / float(row["linear_samples_per_s"])
        )
    assert float(rows[1]["linear_samples_per_s"]) == pytest.approx(2 * one)

    # Each point was the real training: 2 processes, the grown batch, and one clock tick per optimizer step.
    point = OmegaConf.load(run_dir / "points" / "2" / "config.yaml")
    assert point.data.batch_size == 64
    assert len(json.loads((run_dir / "points" / "2.json").read_text())["step_ends"]) == 2 + 3

    png = (run_dir / "scaling.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 100_000
    (run,) = offline_runs(run_dir)
    logged = next(row for row in run.history if "scaling/table/nrows" in row)
    assert logged["scaling/table/nrows"] == 2 and logged["scaling/plot/_type"] == "image-file"
    assert run.config["strategy_preset"] == "ddp"
{%- if cookiecutter.engine == "lightning" %}


# The pipeline's timing is the engines' shared pipelining.py; one engine's run covers it (CI time).
def test_pipeline_bubble(tmp_path, train_env):
    """Both schedules at 2 stages: the measured idle share next to (p-1)/(m+p-1) = 1/5 for 4 micro-batches."""
    _, rows = bench(tmp_path, train_env, "strategy=pipeline", "bench.devices=[2]", "logger=none")

    assert [row["schedule"] for row in rows] == ["gpipe", "1f1b"]
    for row in rows:
        assert int(row["global_batch"]) == 32  # strong scaling: one replica, the same batch
        assert float(row["theoretical_bubble"]) == pytest.approx(1 / 5)
        assert 0 <= float(row["measured_bubble"]) < 1
{%- endif %}
