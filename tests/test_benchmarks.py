"""The benchmark runs (smoke mode: a few steps) and prints a ratio per variant. Numbers are not asserted."""

import re
import subprocess
import sys

import pytest
from conftest import TEMPLATE

# What each engine's project is compared with: the Accelerate engine has no "plain Lightning" to compare.
VARIANTS = {"lightning": ("template", "lightning", "plain"), "accelerate": ("template", "plain")}


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
    row = rf"^{engine}\s+single\s+(\S+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$"
    rows = re.findall(row, result.stdout, re.MULTILINE)
    assert {(setting, variant) for setting, variant, *_ in rows} == {
        (setting, variant) for setting in ("default", "small-step") for variant in VARIANTS[engine]
    }
    for setting, variant, step_ms, ratio, startup, rss in rows:
        assert float(step_ms) > 0 and float(ratio) > 0 and float(startup) > 0 and int(rss) > 0
        if variant == "plain":
            assert float(ratio) == 1.0
    # The targets' table: template / plain loop, and for Lightning template / plain Lightning, per setting.
    targets = re.findall(rf"^{engine}\s+single\s+(\S+)\s+([\d.]+)\s+(\S+)$", result.stdout, re.MULTILINE)
    assert {setting for setting, *_ in targets} == {"default", "small-step"}
    for _, over_loop, over_lightning in targets:
        assert float(over_loop) > 0
        assert (over_lightning == "-") == (engine == "accelerate")
