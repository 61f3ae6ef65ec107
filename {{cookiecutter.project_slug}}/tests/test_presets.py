"""Every preset x precision this machine can host, against strategy=single, in one table for both engines.

On a GPU machine, `pytest -m gpu` runs it on the GPUs (1 GPU: single and compile; 2+: every preset) and prints
the table (preset, precision, ok, seconds per run, peak memory per device). On CPU (CI) it runs the rows the CPU
can host: bf16-mixed is real autocast there. 32-true must give single's losses (loss parity; with tf32=false,
as TF32 matmuls round to 10 bits of mantissa); bf16-mixed must stay close to single's bf16 losses, and differ
from fp32 (the forward really ran in bf16). The compile rows (compile=true) compile each block of the split
presets, sharded or cut, which CI's CPU tests leave out (tests/test_compile.py compiles single and ddp).
"""

import sys
import time

import pytest
import torch
from conftest import PARITY, TOLERANCE, make_runner

pytestmark = [pytest.mark.slow, pytest.mark.gpu]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
GPUS = torch.cuda.device_count()
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
BF16_TOLERANCE = 5e-2  # bf16 keeps 8 bits of mantissa; layouts sum in different orders
COMPILE_TOLERANCE = 1e-4  # fp32: compiled kernels fuse operations and may sum in another order
STEPS = 4  # one epoch (QUICK) of data.train_size / data.batch_size (64): then validation and the memory figures
TABLE = [*(o for o in PARITY if not o.startswith(("trainer.max_steps", "trainer.accelerator"))),
         "trainer.max_steps=-1", "data.train_size=256", "data.val_size=101",
         "trainer.accelerator=" + ("gpu" if GPUS else "cpu")]  # fmt: skip
{%- if cookiecutter.engine == "lightning" %}
MEMORY = ["+callbacks.device_memory._target_={{ cookiecutter.package_name }}.callbacks.device_memory.DeviceMemoryMonitor"]
# (preset, overrides, launcher, processes)
PRESETS = [
    ("single", ["strategy=single"], None, 1),
    ("ddp", ["strategy=ddp", "trainer.devices=2"], None, 2),
    ("ddp_spawn", ["strategy=ddp_spawn", "trainer.devices=2"], None, 2),
    ("dp", ["strategy=dp", "trainer.devices=2"], None, 1),
    ("model_parallel", ["strategy=model_parallel", "trainer.devices=2"], None, 2),
    ("pipeline", ["strategy=pipeline", "trainer.devices=2"], None, 2),
    ("compile", ["strategy=single", "compile=true"], None, 1),
    ("compile-model_parallel", ["strategy=model_parallel", "trainer.devices=2", "compile=true"], None, 2),
    ("compile-pipeline", ["strategy=pipeline", "trainer.devices=2", "compile=true"], None, 2),
]
{%- else %}
MEMORY = ["oom.log_memory=true"]
# (preset, overrides, launcher, processes)
PRESETS = [
    ("single", ["strategy=single"], None, 1),
    ("ddp", ["strategy=ddp"], TORCHRUN, 2),
    ("ddp_spawn", ["strategy=ddp_spawn", "trainer.devices=2"], None, 2),
    ("dp", ["strategy=dp", "trainer.devices=2"], None, 1),
    ("model_parallel", ["strategy=model_parallel"], TORCHRUN, 2),
    ("pipeline", ["strategy=pipeline"], TORCHRUN, 2),
    ("compile", ["strategy=single", "compile=true"], None, 1),
    ("compile-model_parallel", ["strategy=model_parallel", "compile=true"], TORCHRUN, 2),
    ("compile-pipeline", ["strategy=pipeline", "compile=true"], TORCHRUN, 2),
]
{%- endif %}
REFUSED = {"model_parallel", "pipeline"}  # refuse 16-mixed in one line: no sharded gradient scaler


def why_not_here(preset: str, precision: str, processes: int) -> str | None:
    """None if this machine can host the row, else the reason it is skipped."""
    strategy = preset.removeprefix("compile-") if preset != "compile" else "single"
    if strategy in REFUSED and precision == "16-mixed":
        return f"strategy={strategy} refuses trainer.precision=16-mixed in one line before training (no sharded scaler)"
    if preset.startswith("compile") and not GPUS:
        return "compile=true on CPU is tests/test_compile.py's (single, ddp): compiling C++ for every row costs minutes"
    if not GPUS:
        if precision == "16-mixed":
            return "16-mixed autocast and its gradient scaler need a CUDA GPU"
        if precision == "32-true" and preset != "single":
            return "on CPU, fp32 loss parity of every preset is test_parity.py's (not run twice in CI)"
        return None
    if preset == "dp" and GPUS < 2 or processes > GPUS:
        return f"strategy={preset} needs 2 GPUs here; this machine has {GPUS}"
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    return None


ROWS = [(preset, precision) for preset, *_ in PRESETS for precision in PRECISIONS]
RESULTS: list[dict] = []  # printed by conftest's pytest_terminal_summary


@pytest.fixture(scope="module")
def runner(tmp_path_factory, train_env):
    return make_runner(tmp_path_factory.mktemp("presets"), train_env)


@pytest.fixture(scope="module")
def reference(runner):
    """strategy=single's losses and validation metrics, per precision, computed once."""
    cache: dict[str, tuple] = {}

    def get(precision: str):
        if precision not in cache:
            cache[precision] = run_row(runner, "single", ["strategy=single"], None, precision)
        return cache[precision]

    return get


def run_row(runner, preset: str, overrides: list[str], launcher, precision: str):
    start = time.perf_counter()
    exact = ["tf32=false"] if precision == "32-true" else []  # fp32 parity: no TF32 matmuls on the GPU
    run = runner(*TABLE, *MEMORY, *overrides, f"trainer.precision={precision}", *exact, launcher=launcher)
    seconds = time.perf_counter() - start
    wandb = run.wandb
    figures = ("/peak_allocated_mb", "/rss_mb")  # CUDA, CPU
    names = {name for row in wandb.history for name in row if name.startswith("memory/") and name.endswith(figures)}
    memory = {name.removeprefix("memory/").rsplit("/", 1)[0]: wandb.metric(name)[-1] for name in names}
    validation = (wandb.metric("val/loss")[-1], wandb.metric("val/acc")[-1])
    return wandb.metric("train/loss")[:STEPS], validation, {"seconds": seconds, "memory": memory}


@pytest.mark.parametrize("preset, precision", ROWS, ids=[f"{p}-{q}" for p, q in ROWS])
def test_preset_matches_single(runner, reference, preset, precision):
    [(overrides, launcher, processes)] = [(o, launch, n) for name, o, launch, n in PRESETS if name == preset]
    reason = why_not_here(preset, precision, processes)
    if reason:
        pytest.skip(reason)
    row = {"preset": preset, "precision": precision, "ok": False}
    RESULTS.append(row)
    fp32_losses, fp32_val, _ = reference("32-true")
    losses, val, figures = (
        reference(precision) if preset == "single" else run_row(runner, preset, overrides, launcher, precision)
    )
    row.update(figures)
    assert len(losses) == STEPS
    if precision == "32-true":
        tolerance = COMPILE_TOLERANCE if preset.startswith("compile") else TOLERANCE
        assert losses == pytest.approx(fp32_losses, abs=tolerance)
        assert val == pytest.approx(fp32_val, abs=tolerance), "val/loss, val/acc over every sample once"
    else:
        single_losses, single_val, _ = reference(precision)
        assert losses == pytest.approx(single_losses, abs=BF16_TOLERANCE)
        assert losses == pytest.approx(fp32_losses, abs=BF16_TOLERANCE)
        assert losses != pytest.approx(fp32_losses, abs=1e-5), f"{precision} must change the arithmetic"
        assert val == pytest.approx(single_val, abs=BF16_TOLERANCE)
    row["ok"] = True


def test_evaluation_counts_every_sample_once(runner, reference):
    """An odd validation split over 2 replicas: val/loss and val/acc equal one device's. A padding sampler
    (DistributedSampler) would count a repeated sample and differ."""
    _, single_val, _ = reference("32-true")
    [(overrides, launcher)] = [(o, launch) for name, o, launch, _ in PRESETS if name == "ddp"]
    _, val, _ = run_row(runner, "ddp", overrides, launcher, "32-true")
    assert val == pytest.approx(single_val, abs=1e-6)
