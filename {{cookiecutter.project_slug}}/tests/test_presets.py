"""Every layout x precision this machine can host against strategy=single: the one table of tests/layouts.py,
for both engines.

On the CPU (CI) each layout runs in fp32, and in bf16 where the table says (autocast is real on the CPU);
16-mixed needs a CUDA GPU. On a GPU machine `pytest -m gpu` runs every precision of every layout its GPUs can
host (1 GPU: single and compile=true; 2+: every preset), with the GPU-only tests, and prints the table (layout,
precision, ok, seconds per run, peak memory per device). 32-true (tf32=false) must give single's losses and validation
metrics; bf16-mixed must stay close to single's bf16 losses, and differ from fp32 (the forward ran in bf16).
"""

import math
import time
from dataclasses import dataclass

import pytest
import torch
from conftest import QUICK, TOLERANCE, Run, make_runner
from layouts import LAYOUTS, PRECISIONS, REFUSED, Layout, command

from {{ cookiecutter.package_name }}.config import CONFIG_DIR

pytestmark = [pytest.mark.slow, pytest.mark.gpu]

GPUS = torch.cuda.device_count()
# Where a row that runs on GPU machines only is checked on the CPU (by a part of its name); the rest: test_gpt.py.
CPU_ELSEWHERE = {
    "compile": "compile=true is tests/test_compile.py's",
    "fsdp": "tests/test_fsdp.py",
    "hsdp2x2": "its mesh, tests/test_fsdp.py; 2 x 1 x 2 in this table",
}
GPU_TOLERANCE = 1e-4  # fp32 on GPUs: kernels (and compiled ones) sum in other orders
BF16_TOLERANCE = 5e-2  # bf16 keeps 8 bits of mantissa; layouts sum in different orders
STEPS = 4  # one epoch (QUICK) of data.train_size / data.batch_size, then validation and the memory figures
# 129 validation samples: every sample counted once, and over 2 replicas of 32 a batch (65 and 64 samples) one
# replica has a batch fewer, yet must run as many forwards (model_parallel's FSDP2 gathers weights in each).
# Then the test pass, on 64 samples: its metrics at the last step, as every preset logs them.
TABLE = [*(o for o in QUICK if not o.startswith("test_after_fit")), "data.shuffle=false", "data.batch_size=64",
         "data.train_size=256", "data.val_size=129", "data.test_size=64",
         "trainer.accelerator=" + ("gpu" if GPUS else "cpu")]  # fmt: skip


@dataclass
class Result:
    losses: list[float]  # the first STEPS train/loss values
    steps: list[int]  # the global steps they were logged at
    val: tuple[float, float]  # val/loss, val/acc
    test: tuple[list[int], float]  # the steps test/loss was logged at, its value
    world_size: int
    layout: dict[str, int]  # run.layout: replicas x shards x tensor_parallel x stages
    seconds: float
    memory: dict[str, float]  # peak MiB per device (CUDA) or RSS MiB per rank (CPU)


def read(run: Run, seconds: float) -> Result:
    wandb = run.wandb
    figures = ("/peak_allocated_mb", "/rss_mb")  # CUDA, CPU
    names = {name for row in wandb.history for name in row if name.startswith("memory/") and name.endswith(figures)}
    return Result(
        losses=wandb.metric("train/loss")[:STEPS],
        steps=wandb.steps("train/loss")[:STEPS],
        val=(wandb.metric("val/loss")[-1], wandb.metric("val/acc")[-1]),
        test=(wandb.steps("test/loss"), wandb.metric("test/loss")[-1]),
        world_size=wandb.config["run"]["world_size"],
        layout=wandb.config["run"]["layout"],
        seconds=seconds,
        memory={name.removeprefix("memory/").rsplit("/", 1)[0]: wandb.metric(name)[-1] for name in names},
    )


def why_not_here(layout: Layout, precision: str) -> str | None:
    """None if this machine runs the row, else why it is skipped."""
    if (layout.preset, precision) in REFUSED:
        return f"strategy={layout.preset} refuses trainer.precision=16-mixed in one line before training"
    if GPUS:
        if layout.gpus > GPUS:
            return f"{layout.name} needs {layout.gpus} GPUs; this machine has {GPUS}"
        if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16"
        return None
    if precision == "16-mixed":
        return "16-mixed (autocast with a gradient scaler) needs a CUDA GPU"
    if not layout.on_cpu:
        elsewhere = next(
            (where for part, where in CPU_ELSEWHERE.items() if part in layout.name), "with the GPT, tests/test_gpt.py"
        )
        return f"{layout.name} runs on GPU machines (on the CPU: {elsewhere})"
    if precision not in layout.on_cpu:
        return f"on the CPU (CI time) {precision} runs where autocast meets the preset's own code, not in {layout.name}"
    return None


ROWS = [(layout, precision) for layout in LAYOUTS for precision in PRECISIONS]


@pytest.fixture(scope="module")
def runner(tmp_path_factory, train_env):
    return make_runner(tmp_path_factory.mktemp("presets"), train_env)


def run_row(runner, layout: Layout, precision: str) -> Result:
    overrides, launcher = command(layout)
    start = time.perf_counter()
    exact = ["tf32=false"] if precision == "32-true" else []  # fp32 parity: no TF32 matmuls on the GPU
    run = runner(*TABLE, "oom.log_memory=true", *overrides, f"trainer.precision={precision}", *exact, launcher=launcher)
    return read(run, time.perf_counter() - start)


@pytest.fixture(scope="module")
def reference(runner):
    """strategy=single's result per precision, computed once."""
    cache: dict[str, Result] = {}

    def get(precision: str) -> Result:
        if precision not in cache:
            cache[precision] = run_row(runner, LAYOUTS[0], precision)
        return cache[precision]

    return get


@pytest.mark.parametrize("layout, precision", ROWS, ids=[f"{layout.name}-{precision}" for layout, precision in ROWS])
def test_layout_matches_single(reference, runner, table_row, layout, precision):
    if reason := why_not_here(layout, precision):
        pytest.skip(reason)
    row = table_row(layout=layout.name, precision=precision)
    fp32 = reference("32-true")
    result = reference(precision) if layout.name == "single" else run_row(runner, layout, precision)
    row.update(seconds=result.seconds, memory=result.memory)
    assert result.steps == list(range(STEPS)), "train/loss logged at every global step"
    assert result.test[0] == [STEPS], "test/loss once, at the last step"
    assert result.world_size == layout.processes
    assert result.layout == layout.expected_layout(GPUS), "the preset is the special case of the layout it says"
    if precision == "32-true":
        tolerance = GPU_TOLERANCE if GPUS else TOLERANCE
        assert result.losses == pytest.approx(fp32.losses, abs=tolerance)
        assert result.val == pytest.approx(fp32.val, abs=tolerance), "val/loss, val/acc over every sample once"
        assert result.test[1] == pytest.approx(fp32.test[1], abs=tolerance)
    else:
        single = reference(precision)
        assert result.losses == pytest.approx(single.losses, abs=BF16_TOLERANCE)
        assert result.losses == pytest.approx(fp32.losses, abs=BF16_TOLERANCE)
        assert result.losses != pytest.approx(fp32.losses, abs=1e-5), f"{precision} must change the arithmetic"
        assert result.val == pytest.approx(single.val, abs=BF16_TOLERANCE)
    row["ok"] = True


CAP_MIB = 1024


@pytest.mark.gpu(1)
def test_the_batch_size_search_meets_a_real_cuda_out_of_memory(runner, table_row):
    """The search doubles the batch until CUDA really runs out of memory (the net lets its process use CAP_MIB of
    the GPU: a bounded search on any GPU), bisects, and trains with 90% of the largest batch that fit."""
    row = table_row(layout="single+batch-size-search", precision="32-true")
    capped = ["model.net._target_=simulated_oom.MemoryCappedMLP", f"+model.net.cuda_mib={CAP_MIB}"]
    start = time.perf_counter()
    run = runner(
        *QUICK, "strategy=single", "trainer.accelerator=gpu", "trainer.precision=32-true", *capped,
        "oom.log_memory=true", "oom.find_batch_size=true",
        "model.net.hidden=1024",  # ~0.5 GiB of weights, gradients and AdamW state: the rest fits ~3000 samples
        # Plain segments, which the allocator's memory cap is known to bound, not the default expandable ones.
        env=dict.fromkeys(("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:False"),
    )  # fmt: skip
    result, wandb = read(run, time.perf_counter() - start), run.wandb
    row.update(seconds=result.seconds, memory=result.memory)
    [largest] = wandb.metric("batch_size_finder/largest_fitting")
    assert 0 < largest < 4096, "the search must stop at an out-of-memory error, below its maximum of 4096"
    assert wandb.metric("batch_size_finder/global_batch_size") == [int(largest * 0.9)]
    assert result.losses and all(math.isfinite(loss) for loss in result.losses), "then trains with what it found"
    assert result.memory and max(result.memory.values()) <= CAP_MIB
    row["ok"] = True


def test_a_preset_file_of_yours_trains_as_the_built_in_one_it_copies(reference, runner, tmp_path):
    """configs/strategy/ddp.yaml copied as ddp4.yaml, a setting changed (lightning-hydra-template users' way): how a
    preset starts its processes (the Accelerate command starts torchrun for a launched preset), which checks apply
    and how it resumes are keyed on the built-in preset's name; a copy under another name ran one process, or
    refused the OOM toolkit. It trains as ddp does: two processes, single's losses (which preset a file is:
    tests/test_launcher.py)."""
    if 0 < GPUS < 2:
        pytest.skip("needs 2 CUDA GPUs or none")
    own = tmp_path / "configs"
    (own / "strategy").mkdir(parents=True)
    copied = (CONFIG_DIR / "strategy" / "ddp.yaml").read_text().replace("minutes: 10", "minutes: 5")
    (own / "strategy" / "ddp4.yaml").write_text(copied)
    mine = [f"hydra.searchpath=[file://{own}]", "strategy=ddp4", "trainer.devices=2"]
    run = runner(*TABLE, *mine, "oom=toolkit", "tf32=false")  # (its recovery: ddp's presets only)
    assert run.wandb.config["run"]["world_size"] == 2, "two processes, as strategy=ddp trainer.devices=2"
    assert run.wandb.config["run"]["strategy_preset"] == "ddp4", "named as given"
    assert run.wandb.metric("train/loss")[:STEPS] == pytest.approx(reference("32-true").losses, abs=TOLERANCE)
