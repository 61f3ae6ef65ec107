"""`python -m {{ cookiecutter.package_name }}.doctor`, run for real on this machine (CPU, gloo, no NVML here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from {{ cookiecutter.package_name }}.config import CONFIG_DIR, register_resolvers

PACKAGE = "{{ cookiecutter.package_name }}"
NO_BANDWIDTH = "doctor.allreduce.sizes_mb=[]"  # the plans below do not need the (seconds long) measurement

pytestmark = pytest.mark.slow  # each test starts the doctor in its own process


def doctor(tmp_path: Path, env: dict[str, str], *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "doctor"
    command = [sys.executable, "-m", f"{PACKAGE}.doctor", f"hydra.run.dir={run_dir}", *overrides]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return proc, run_dir


def report(tmp_path: Path, env: dict[str, str], *overrides: str) -> dict:
    proc, run_dir = doctor(tmp_path, env, *overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = run_dir / "doctor.json"
    assert f"report written to {path}" in proc.stdout
    return json.loads(path.read_text())


def configured_net(*overrides: str) -> torch.nn.Module:
    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return instantiate(compose("train", overrides=list(overrides)).model.net)


def test_doctor_on_cpu(tmp_path, train_env):
    """Environment, empty GPU sections with their reason, a measured all-reduce, the model and its arithmetic."""
    result = report(tmp_path, train_env, "model.net.hidden=64", "doctor.allreduce.iterations=2")

    env = result["environment"]
    assert env["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert env["gpus"] == [] and "no CUDA device" in env["why_no_gpus"]
        assert result["topology"]["pairs"] == [] and result["topology"]["why_empty"]

    bandwidth = result["allreduce"]
    n = bandwidth["processes"]
    assert n >= 2 and len(bandwidth["sizes"]) == 3
    for row in bandwidth["sizes"]:  # nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n
        assert row["algbw_gbs"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 2 * (n - 1) / n)

    model = result["model"]
    net = configured_net("model.net.hidden=64")
    assert model["parameters"] == sum(p.numel() for p in net.parameters())
    assert model["optimizer_state_bytes_per_parameter"] == 8  # AdamW: exp_avg and exp_avg_sq in fp32
    assert model["activation_bytes_per_sample"] > 0
    assert model["step_seconds_one_device"] > 0

    params, batch = model["parameters"], model["global_batch"]
    state = params * (4 + 4 + 8)
    single = next(row for row in result["memory"] if row["preset"] == "single" and row["devices"] == 1)
    assert single["bytes"] == pytest.approx(state + model["activation_bytes_per_sample"] * batch)
    busbw = bandwidth["sizes"][-1]["busbw_gbs"]
    for row in result["traffic"]:  # ring 2(N/P)(P-1) per device, parameter server N(P-1)
        p = row["devices"]
        assert row["gradient_bytes"] == 4 * params
        assert row["ring_bytes_per_device"] == pytest.approx(2 * 4 * params / p * (p - 1))
        assert row["parameter_server_bytes"] == pytest.approx(4 * params * (p - 1))
        assert row["ring_seconds"] == pytest.approx(row["ring_bytes_per_device"] / (busbw * 1e9))

    advice = result["recommendation"]
    if not torch.cuda.is_available():  # one CPU: one device
        assert advice["preset"] == "single"
        assert advice["command"] == f"python -m {PACKAGE}.train strategy=single model.net.hidden=64"


def test_doctor_splits_a_model_too_big_for_pretend_devices(tmp_path, train_env):
    """4 devices of 5 MB: one replica (~14 MB) fits on none, sharded over 4 it does."""
    result = report(tmp_path, train_env, NO_BANDWIDTH, "doctor.device_memory_gb=0.005", "doctor.devices=4")
    usable = 0.9 * 0.005e9
    single = next(row for row in result["memory"] if row["preset"] == "single" and row["devices"] == 1)
    assert single["bytes"] > usable
    advice = result["recommendation"]
    assert advice["preset"] in ("model_parallel", "pipeline") and advice["nodes"] == 1
    assert advice["bytes_per_device"] <= usable
    assert f"strategy={advice['preset']}" in advice["command"]
    if advice["preset"] == "model_parallel":
        assert "strategy.tensor_parallel_size=4" in advice["command"]


def test_doctor_plans_several_nodes(tmp_path, train_env):
    """2 devices of 5 MB per node are not enough: the plan spans nodes, launched with torchrun on each."""
    result = report(tmp_path, train_env, NO_BANDWIDTH, "doctor.device_memory_gb=0.005", "doctor.devices=2")
    advice = result["recommendation"]
    assert advice["preset"] == "model_parallel" and advice["nodes"] >= 2
    assert advice["bytes_per_device"] <= 0.9 * 0.005e9
    assert advice["command"].startswith(f"torchrun --nnodes={advice['nodes']} --nproc_per_node=2 ")


def test_doctor_rejects_a_nonsense_device_size(tmp_path, train_env):
    proc, run_dir = doctor(tmp_path, train_env, NO_BANDWIDTH, "doctor.device_memory_gb=-1")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "error: doctor.device_memory_gb=-1 must be > 0" in output and "Traceback" not in output
    assert not run_dir.exists()
