"""The CPU-reachable logic of the GPU paths (each GPU-only part has its test, skipped without a GPU):
allocator settings, pipeline stage timing and the steps it is gathered on, meta-device init of sharded models, FSDP2's
mixed precision, evaluation split over replicas, the precision `auto` picks without initialising CUDA, TF32."""

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore  # torch's one-process stand-in for N ranks

from {{ cookiecutter.package_name }}.data import IGNORED
from {{ cookiecutter.package_name }}.data.loading import Data
from {{ cookiecutter.package_name }}.data.synthetic import data_settings
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.pipelining import Pipeline, PipelinedNet, TimedStage
from {{ cookiecutter.package_name }}.parallel.sharding import OnMeta, is_on_meta, materialize, parallelize
from {{ cookiecutter.package_name }}.runtime.memory import (
    allocator_env_names,
    configure_allocator,
    memory_metrics,
    process_memory_figures,
)
from {{ cookiecutter.package_name }}.runtime.precision import has_native_bf16, resolve_precision, use_tensor_cores


def test_the_allocator_variable_is_the_one_the_installed_torch_reads():
    assert allocator_env_names("2.13.0") == ("PYTORCH_ALLOC_CONF",)
    assert allocator_env_names("2.4.1+cu121") == ("PYTORCH_CUDA_ALLOC_CONF",)


def test_a_users_allocator_setting_wins():
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    configure_allocator(environ)
    assert environ == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}


@pytest.mark.gpu(1)  # the allocator is configured only where CUDA exists
def test_expandable_segments_are_set_before_cuda_initialises():
    environ: dict[str, str] = {}
    configure_allocator(environ)
    assert environ == dict.fromkeys(allocator_env_names(), "expandable_segments:True") or torch.cuda.is_initialized()


def test_pipeline_stage_timing_without_cuda_adds_up_wall_time():
    stage = object.__new__(TimedStage)
    stage.device = torch.device("cpu")
    with stage._busy():
        torch.randn(64, 64) @ torch.randn(64, 64)
    assert stage.take_busy_seconds() == 0, "a step that is not measured is not timed"
    stage.timing = True
    with stage._busy():
        torch.randn(64, 64) @ torch.randn(64, 64)
    assert stage.take_busy_seconds() > 0 and stage.take_busy_seconds() == 0


@pytest.fixture
def process_group():
    """A process group of this process alone (gloo), as every stage of a pipeline has one."""
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_only_the_logged_pipeline_steps_time_the_stages_and_gather_their_figures(process_group, monkeypatch):
    """A step that is not logged neither waits for this stage's work (CUDA events) nor all_gathers the loss and
    idle shares: both would serialise the stages every step; the loss stays on the last stage."""
    pipeline = Pipeline(PipelinedNet.of(ResidualMLP(32, 8, hidden=16, depth=2), 0, 1), torch.device("cpu"), 2,
                        "gpipe", F.cross_entropy)  # fmt: skip
    waits, gathers = [], []
    take_busy_seconds, all_gather = TimedStage.take_busy_seconds, dist.all_gather
    monkeypatch.setattr(TimedStage, "take_busy_seconds", lambda stage: waits.append(1) or take_busy_seconds(stage))
    monkeypatch.setattr(dist, "all_gather", lambda *args, **kwargs: gathers.append(1) or all_gather(*args, **kwargs))
    x, y = torch.randn(8, 32), torch.randint(0, 8, (8,))
    loss, idle = pipeline.train_step(x, y, measure=False)
    assert idle is None and waits == [] and gathers == [] and pipeline.parts[0].busy_seconds == 0
    logged, idle = pipeline.train_step(x, y, measure=True)  # the same weights: no optimizer step in between
    assert waits == gathers == [1] and len(idle) == 1 and 0 <= idle[0] < 1
    assert logged.item() == pytest.approx(loss.item())


@pytest.mark.gpu(1)
def test_pipeline_stage_timing_with_cuda_events():
    stage = object.__new__(TimedStage)
    stage.device = torch.device("cuda")
    stage.timing = True
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


@pytest.mark.parametrize("precision, gathered", [("bf16-mixed", torch.bfloat16), ("32-true", torch.float32)])
def test_fsdp2_units_gather_the_weights_in_the_precision_of_the_run(precision, gathered):
    """model_parallel over a (data_parallel=2 x tensor_parallel=2) mesh: under bf16-mixed each FSDP2 unit gathers
    its weights in bf16 (half the traffic, and what autocast computes in), not in fp32. The mesh is made in this one
    process by torch's fake process group (its collectives move no data: only the dtypes are checked)."""
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))
        net = ResidualMLP(32, 8, hidden=16, depth=2)
        parallelize(net, mesh, precision)
        seen = []
        net.blocks[0].fc_in.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
        net(torch.randn(4, 32))
        assert seen == [gathered]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", [11, 9, 1], ids=["even-batches", "one-batch-more", "fewer-samples-than-replicas"])
def test_evaluation_splits_every_sample_once_over_replicas_in_equal_batch_counts(size):
    """Each sample once (no repeat counts in a metric), and every replica runs as many forwards: one that would
    run one fewer would leave the others waiting in their forward's weight gather (model_parallel's FSDP2)."""
    data = Data(**data_settings(batch_size=4, val_size=size))  # 2 samples a batch on each of 2 replicas
    batches = [list(data.loader("val", 2, rank)) for rank in range(2)]
    assert len(batches[0]) == len(batches[1])
    counted = [x for replica in batches for xs, ys in replica for x, y in zip(xs, ys, strict=True) if y != IGNORED]
    assert len(counted) == size
    assert torch.equal(torch.stack(sorted(counted, key=lambda x: x[0].item())),
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


@pytest.mark.gpu(2)
def test_every_gpu_of_the_process_has_its_figures():
    names, rows = process_memory_figures([torch.device("cuda", 0), torch.device("cuda", 1)])
    assert names[0] == "peak_allocated_mb" and len(rows) == 2


def test_precision_auto_is_fp32_on_the_cpu_and_bf16_on_a_bf16_gpu():
    assert resolve_precision("auto", "cpu") == "32-true"
    gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    assert resolve_precision("auto", "auto") == ("bf16-mixed" if gpu_bf16 else "32-true")
    assert resolve_precision(32, "cpu") == "32-true"
    # Lightning's Trainer trains 16-mixed on the CPU in bf16-mixed; the Accelerate engine trained fp16: both bf16 now
    assert resolve_precision("16-mixed", "cpu") == "bf16-mixed"
    assert resolve_precision("bf16", "cpu") == "bf16-mixed"  # Lightning's short names, as it takes them
    assert resolve_precision(16, "cpu") == "bf16-mixed"  # 16-mixed, on the CPU
    with pytest.raises(ConfigError, match="trainer.precision=8 is unknown; valid: auto, 32-true"):
        resolve_precision(8, "cpu")


def test_bf16_is_native_from_compute_capability_8_on_every_gpu():
    assert has_native_bf16([(8, 0), (9, 0)]) and has_native_bf16([(12, 1)])
    assert not has_native_bf16([(8, 6), (7, 5)]), "one Turing GPU emulates bf16: fp32 for all"
    assert not has_native_bf16([]), "nothing known: fp32"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the test below checks the real thing")
def test_precision_auto_is_decided_without_initialising_cuda(monkeypatch):
    """As on a GPU machine (torch.cuda.is_available() says yes): `auto` must not ask torch.cuda, which would
    initialise CUDA in the process that Accelerate's ddp_spawn forks next. NVML answers nothing here: fp32."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_precision("auto", "auto") == "32-true"
    assert not torch.cuda.is_initialized()


@pytest.mark.gpu(1)  # a CUDA GPU to leave uninitialised
def test_precision_auto_on_a_gpu_leaves_cuda_uninitialised():
    code = (
        "import torch; from {{ cookiecutter.package_name }}.runtime.precision import resolve_precision; "
        "print(resolve_precision('auto', 'auto'), torch.cuda.is_initialized())"
    )
    precision, initialised = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    assert initialised == "False"
    oldest = min(torch.cuda.get_device_capability(index) for index in range(torch.cuda.device_count()))
    assert precision == ("bf16-mixed" if oldest >= (8, 0) else "32-true")


def test_tf32_false_makes_fp32_matmuls_exact_again():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("high")
        use_tensor_cores(tf32=False)
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        use_tensor_cores(tf32=True)  # on the CPU (or a GPU older than Ampere) nothing changes
        expected = "high" if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0) else "highest"
        assert torch.get_float32_matmul_precision() == expected
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
