"""The CPU-reachable logic of the GPU paths (each GPU-only part has its test, skipped without a GPU):
allocator settings, pipeline stage timing, meta-device init of sharded models."""

import pytest
import torch

from {{ cookiecutter.package_name }}.config import ConfigError
from {{ cookiecutter.package_name }}.data import Data
from {{ cookiecutter.package_name }}.memory import (
    allocator_env_names,
    configure_allocator,
    memory_metrics,
    process_memory_figures,
)
from {{ cookiecutter.package_name }}.model import ResidualMLP
from {{ cookiecutter.package_name }}.pipelining import TimedStage
from {{ cookiecutter.package_name }}.precision import resolve_precision
from {{ cookiecutter.package_name }}.sharding import OnMeta, is_on_meta, materialize
from {{ cookiecutter.package_name }}.synthetic import data_settings


def test_the_allocator_variable_is_the_one_the_installed_torch_reads():
    assert allocator_env_names("2.13.0") == ("PYTORCH_ALLOC_CONF",)
    assert allocator_env_names("2.4.1+cu121") == ("PYTORCH_CUDA_ALLOC_CONF",)


def test_a_users_allocator_setting_wins():
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    configure_allocator(environ)
    assert environ == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator is configured only where CUDA exists")
def test_expandable_segments_are_set_before_cuda_initialises():
    environ: dict[str, str] = {}
    configure_allocator(environ)
    assert environ == dict.fromkeys(allocator_env_names(), "expandable_segments:True") or torch.cuda.is_initialized()


def test_pipeline_stage_timing_without_cuda_adds_up_wall_time():
    stage = object.__new__(TimedStage)
    stage.device = torch.device("cpu")
    with stage._busy():
        torch.randn(64, 64) @ torch.randn(64, 64)
    assert stage.take_busy_seconds() > 0 and stage.take_busy_seconds() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events time GPU kernels")
def test_pipeline_stage_timing_with_cuda_events():
    stage = object.__new__(TimedStage)
    stage.device = torch.device("cuda")
    with stage._busy():
        torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
    assert stage.take_busy_seconds() > 0


def test_a_net_built_on_meta_materialises_with_the_values_a_normal_build_draws():
    torch.manual_seed(3)
    expected = ResidualMLP(in_features=32, num_classes=8).state_dict()
    torch.manual_seed(3)
    with OnMeta() as init:
        net = ResidualMLP(in_features=32, num_classes=8)
    assert is_on_meta(net) and all(p.is_meta for p in net.parameters()), "nothing allocated yet"
    torch.randn(5)  # anything drawn between the build and materialize must not matter
    materialize(net, torch.device("cpu"), init.rng_state)
    assert not is_on_meta(net)
    for name, value in net.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_evaluation_splits_every_sample_once_over_replicas():
    data = Data(**data_settings(batch_size=4, val_size=11))
    seen = [x for rank in range(2) for batch, _ in data.loader("val", 2, rank) for x in batch]
    assert len(seen) == 11
    assert torch.equal(torch.stack(sorted(seen, key=lambda x: x[0].item())),
                       torch.stack(sorted(data.splits["val"].tensors[0], key=lambda x: x[0].item())))  # fmt: skip


def test_memory_is_logged_per_device_and_the_imbalance_covers_every_device():
    names, rows = process_memory_figures([torch.device("cpu"), torch.device("cpu")])
    assert names == ["rss_mb"] and len(rows) == 1, "CPU devices share the process's memory"
    # dp on 2 GPUs: one process, two devices, GPU 0 holding the gathered outputs.
    metrics = memory_metrics(["peak_allocated_mb", "peak_reserved_mb"], [[[300.0, 400.0], [100.0, 120.0]]])
    assert metrics["memory/rank0/device0/peak_allocated_mb"] == 300.0
    assert metrics["memory/rank0/device1/peak_reserved_mb"] == 120.0
    assert metrics["memory/imbalance"] == 3.0
    assert memory_metrics(["rss_mb"], [[[100.0]], [[200.0]]]) == {
        "memory/rank0/rss_mb": 100.0,
        "memory/rank1/rss_mb": 200.0,
        "memory/imbalance": 2.0,
    }


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs to see two devices' peaks")
def test_every_gpu_of_the_process_has_its_figures():
    names, rows = process_memory_figures([torch.device("cuda", 0), torch.device("cuda", 1)])
    assert names[0] == "peak_allocated_mb" and len(rows) == 2


def test_precision_auto_is_fp32_on_the_cpu_and_bf16_on_a_bf16_gpu():
    assert resolve_precision("auto", "cpu") == "32-true"
    gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    assert resolve_precision("auto", "auto") == ("bf16-mixed" if gpu_bf16 else "32-true")
    assert resolve_precision(32, "cpu") == "32-true" and resolve_precision("16-mixed", "cpu") == "16-mixed"
    with pytest.raises(ConfigError, match="trainer.precision=16 is unknown; valid: auto, 32-true"):
        resolve_precision(16, "cpu")
