"""The benchmark runs (smoke mode: a few steps) and prints a ratio per variant. Numbers are not asserted."""

import re
import subprocess
import sys

import pytest
from conftest import TEMPLATE

# What each engine's project is compared with: the Accelerate engine has no "plain Lightning" to compare. (The A/A
# pair, the template run twice, is left out of the smoke run: CI time.)
VARIANTS = {
    "lightning": ("template", "lightning", "plain"),
    "accelerate": ("template", "plain"),
}
RATIOS = r"([\d.]+)/([\d.]+)"  # wall time / CPU time


@pytest.mark.parametrize("engine", VARIANTS)
def test_overhead_benchmark_smoke(tmp_path, engine):
    result = subprocess.run(
        [sys.executable, str(TEMPLATE / "benchmarks" / "overhead.py"), "--smoke", "--engine", engine],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # engine, layout, setting, variant, step ms, /plain, CPU ms, /plain, start-up s, peak RSS MB (smoke: small steps)
    numbers = r"\s+".join([r"([\d.]+)"] * 5 + [r"(\d+)"])
    rows = re.findall(rf"^{engine}\s+single\s+small-step\s+(\S+(?: A/A)?)\s+{numbers}$", result.stdout, re.MULTILINE)
    assert {variant for variant, *_ in rows} == set(VARIANTS[engine])
    for variant, step_ms, ratio, cpu_ms, cpu_ratio, startup, rss in rows:
        assert float(step_ms) > 0 and float(cpu_ms) > 0 and float(startup) > 0 and int(rss) > 0
        assert (float(ratio) == float(cpu_ratio) == 1.0) == (variant == "plain")
    # The targets' table: template / plain loop, (Lightning) template / plain Lightning, and no A/A pair (smoke).
    [targets] = re.findall(rf"^{engine}\s+single\s+small-step\s+{RATIOS}\s+(\S+)\s+-$", result.stdout, re.MULTILINE)
    over_loop, over_lightning = targets[:2], targets[2]
    assert all(float(value) > 0 for value in over_loop)
    assert (over_lightning == "-") == (engine == "accelerate")


def test_the_gpu_comparison_runs_on_the_cpu_as_a_dry_run(tmp_path):
    """`overhead.py --gpu` (the GPT through the template's bench against benchmarks/gpu_loop.py), dry-run on the CPU
    with a tiny GPT: both variants train and report, and the ratio is theirs. Its GPU figures: the README."""
    command = [sys.executable, str(TEMPLATE / "benchmarks" / "overhead.py"), "--gpu", "--cpu", "--size", "tiny"]
    command += ["--engine", "accelerate", "--warmup", "2", "--steps", "3"]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    number = r"([\d.]+)"
    [(template_ms, template_tokens, ratio)] = re.findall(
        rf"^accelerate\s+template\s+{number}\s+{number}\s+[\d.]+%\s+{number}$", result.stdout, re.MULTILINE
    )
    [(loop_ms, loop_tokens)] = re.findall(
        rf"^accelerate\s+loop\s+{number}\s+{number}\s+[\d.]+%\s*$", result.stdout, re.MULTILINE
    )
    assert float(ratio) == pytest.approx(float(template_ms) / float(loop_ms), rel=0.02)
    assert float(template_tokens) > 0 and float(loop_tokens) > 0
