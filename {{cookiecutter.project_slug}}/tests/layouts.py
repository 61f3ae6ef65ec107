"""The one table of layouts the parity tests run (test_presets.py), for both engines: each preset and launch
mode, the processes and GPUs it takes, and the precisions it runs on the CPU (CI); on a GPU machine every
precision the machine can host runs. `command(layout)` says how this project's engine starts it, as the README
does: Lightning starts its own processes (trainer.devices), Accelerate is started by `accelerate launch`.
"""

import sys
from dataclasses import dataclass

from engine_specific import launcher_of

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
FP32, BF16 = ("32-true",), ("32-true", "bf16-mixed")


@dataclass(frozen=True)
class Layout:
    name: str  # the test id: <preset>[-<variant>]
    overrides: tuple[str, ...]  # the same for both engines
    processes: int = 1  # training processes (run.world_size)
    gpus: int = 1  # CUDA GPUs it needs on a GPU machine
    torchrun: bool = False  # started by torchrun instead of the engine's usual way
    # Precisions run on the CPU (CI time): bf16 where autocast meets the preset's own code (single's reference,
    # dp's replicas, FSDP2's mixed-precision policy, the pipeline's stages); ddp, ddp_spawn and the layer split run
    # the forward as single does, and all of them in bf16 on GPU machines.
    on_cpu: tuple[str, ...] = FP32
    # What the run logs as its layout (run.layout, parallel/layout.py): replicas x shards x tensor_parallel x stages;
    # () = data parallel over its processes.
    factors: tuple[int, int, int, int] = ()

    @property
    def preset(self) -> str:
        return self.name.split("-")[0]

    def expected_layout(self, gpus: int) -> dict[str, int]:
        replicas, shards, tensor_parallel, stages = self.factors or (self.processes, 1, 1, 1)
        if self.preset == "dp":  # replicas in threads, one per GPU; without 2 GPUs it runs on one device
            replicas = 2 if gpus >= 2 else 1
        if self.name == "model_parallel-layers" and gpus >= 2:  # a layer group on every visible GPU
            stages = gpus
        devices = replicas * shards * tensor_parallel * stages
        return dict(replicas=replicas, shards=shards, tensor_parallel=tensor_parallel, stages=stages, devices=devices)


MODEL_PARALLEL, PIPELINE = ("strategy=model_parallel",), ("strategy=pipeline", "trainer.devices=2")
LAYOUTS = [
    Layout("single", ("strategy=single",), on_cpu=BF16),
    Layout("ddp", ("strategy=ddp", "trainer.devices=2"), processes=2, gpus=2),
    Layout("ddp-torchrun", ("strategy=ddp", "trainer.devices=2"), processes=2, gpus=2, torchrun=True),
    Layout("ddp_spawn", ("strategy=ddp_spawn", "trainer.devices=2"), processes=2, gpus=2),
    # One process; on the CPU one device, through the same replica code.
    Layout("dp", ("strategy=dp", "trainer.devices=2"), gpus=2, on_cpu=BF16),
    Layout(
        "model_parallel-tp2",
        (*MODEL_PARALLEL, "trainer.devices=2"),
        processes=2,
        gpus=2,
        on_cpu=BF16,
        factors=(1, 1, 2, 1),
    ),
    Layout(
        "model_parallel-dp2xtp2",
        (*MODEL_PARALLEL, "trainer.devices=4", "strategy.data_parallel_size=2", "strategy.tensor_parallel_size=2"),
        processes=4,
        gpus=4,
        factors=(1, 2, 2, 1),
    ),
    # HSDP x tensor parallel, three factors in one mesh: 2 replicas x 1 shard x 2 tensor-parallel processes, and
    # 2 x 2 x 2 (8 processes; GPU machines; its mesh on the CPU: test_fsdp.py).
    Layout(
        "model_parallel-hsdp2xtp2",
        (*MODEL_PARALLEL, "trainer.devices=4", "strategy.data_parallel_size=2", "strategy.replicas=2"),
        processes=4,
        gpus=4,
        factors=(2, 1, 2, 1),
    ),
    Layout(
        "model_parallel-hsdp2x2xtp2",
        (*MODEL_PARALLEL, "trainer.devices=8", "strategy.data_parallel_size=4", "strategy.replicas=2"),
        processes=8,
        gpus=8,
        on_cpu=(),
        factors=(2, 2, 2, 1),
    ),
    # FSDP2 over every process: its CPU parity and resume are tests/test_fsdp.py's; HSDP (2 replicas of 2 shards)
    # with CPU offload and the gathered weights kept for the backward, every option at once.
    Layout("fsdp", ("strategy=fsdp", "trainer.devices=2"), processes=2, gpus=2, on_cpu=(), factors=(1, 2, 1, 1)),
    Layout(
        "fsdp-hsdp",
        (
            "strategy=fsdp",
            "trainer.devices=4",
            "strategy.replicas=2",
            "strategy.offload=true",
            "strategy.reshard_after_forward=false",
        ),
        processes=4,
        gpus=4,
        factors=(2, 2, 1, 1),
    ),
    # One process, layer groups on every visible GPU (two CPU "devices" without GPUs).
    Layout(
        "model_parallel-layers",
        (*MODEL_PARALLEL, "strategy.mode=layers", "trainer.devices=1"),
        gpus=2,
        factors=(1, 1, 1, 2),
    ),
    Layout(
        "pipeline-gpipe", (*PIPELINE, "strategy.schedule=gpipe"), processes=2, gpus=2, on_cpu=BF16, factors=(1, 1, 1, 2)
    ),
    Layout(
        "pipeline-1f1b-torchrun",
        (*PIPELINE, "strategy.schedule=1f1b"),
        processes=2,
        gpus=2,
        torchrun=True,
        factors=(1, 1, 1, 2),
    ),
    # The looped schedules: each of the 2 processes runs 2 of the net's 4 stages (stage s on process s % 2; zbv: in a
    # V, process 0 runs the first and the last).
    Layout(
        "pipeline-interleaved",
        (*PIPELINE, "strategy.schedule=interleaved_1f1b"),
        processes=2,
        gpus=2,
        factors=(1, 1, 1, 2),
    ),
    Layout("pipeline-zbv", (*PIPELINE, "strategy.schedule=zbv"), processes=2, gpus=2, factors=(1, 1, 1, 2)),
    # Two pipelines of two stages side by side, each on half of the global batch.
    Layout(
        "pipeline-dp2",
        ("strategy=pipeline", "trainer.devices=4", "strategy.data_parallel_size=2"),
        processes=4,
        gpus=4,
        factors=(2, 1, 1, 2),
    ),
    # Each stage's blocks sharded over 2 processes (tensor parallelism inside the pipeline), and all three at once:
    # 2 pipelines x 2 stages x 2 shards. On the CPU with the GPT only (test_gpt.py): its heads are what they shard.
    Layout(
        "pipeline-tp2",
        ("strategy=pipeline", "trainer.devices=4", "strategy.tensor_parallel_size=2"),
        processes=4,
        gpus=4,
        on_cpu=(),
        factors=(1, 1, 2, 2),
    ),
    Layout(
        "pipeline-dp2xtp2",
        ("strategy=pipeline", "trainer.devices=8", "strategy.data_parallel_size=2", "strategy.tensor_parallel_size=2"),
        processes=8,
        gpus=8,
        on_cpu=(),
        factors=(2, 1, 2, 2),
    ),
    # compile=true (the whole net; each block of the split presets), on GPU machines only: compiling C++ for each
    # row would cost CI minutes (tests/test_compile.py compiles single and ddp on the CPU).
    Layout("single-compile", ("strategy=single", "compile=true"), on_cpu=()),
    Layout(
        "model_parallel-compile",
        (*MODEL_PARALLEL, "trainer.devices=2", "compile=true"),
        processes=2,
        gpus=2,
        on_cpu=(),
        factors=(1, 1, 2, 1),
    ),
    Layout("pipeline-compile", (*PIPELINE, "compile=true"), processes=2, gpus=2, on_cpu=(), factors=(1, 1, 1, 2)),
]
# Refused in one line before training (the configs tests check the line): no gradient scaler for shards or stages.
REFUSED = {("model_parallel", "16-mixed"), ("pipeline", "16-mixed")}


def layout(name: str) -> Layout:
    [found] = [row for row in LAYOUTS if row.name == name]
    return found


def command(layout: Layout) -> tuple[list[str], list[str] | None]:
    """(overrides, launcher prefix or None for `python -m`) that start `layout` under this project's engine."""
    if layout.torchrun:
        return list(layout.overrides), torchrun(layout.processes)
    return list(layout.overrides), launcher_of(layout.preset, layout.processes)


def torchrun(processes: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m"]
