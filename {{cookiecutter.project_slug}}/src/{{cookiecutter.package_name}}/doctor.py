"""Which preset, on how many devices? Run from the project root, with the overrides you would train with:

    python -m {{ cookiecutter.package_name }}.doctor [model.net.hidden=4096 data.batch_size=1024 ...]
    python -m {{ cookiecutter.package_name }}.doctor doctor.device_memory_gb=24 doctor.devices=8   # plan for other GPUs

environment -> topology -> all-reduce bandwidth -> the model's size -> memory per device for each preset ->
gradient traffic -> a recommendation with its command. Prints tables and writes doctor.json into its run folder.
Trains nothing; the model is sized on the meta device, so it may be far bigger than this machine.
"""

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from .config import CONFIG_DIR
from .config.command_line import run_cli
from .config.objects import build_object, register_resolvers, unresolved
from .engine.launching import train_command
from .errors import UNRESOLVED, ConfigError, fail
from .parallel.presets import built_in_preset
from .parallel.split import split_blocks
from .runtime import hardware
from .runtime.precision import resolve_precision, use_tensor_cores
from .tools.estimate import (
    CANNOT_SHARD,
    DP_DEVICE_0,
    NO_PLAN,
    NOT_A_CHAIN,
    REFUSES_BATCHNORM,
    REFUSES_LAZY,
    USABLE,
    ModelFacts,
    check_model_settings,
    dp_memory,
    gradient_traffic,
    memory_per_device,
    mesh,
    model_facts,
)
from .tools.settings import number, number_list, settings_group, whole_number

register_resolvers()

PRESETS = ("single", "ddp", "dp", "fsdp", "model_parallel", "pipeline")
NOT_MEMORY = (REFUSES_BATCHNORM, REFUSES_LAZY, CANNOT_SHARD, NO_PLAN, NOT_A_CHAIN)  # the model's reasons for a "-"
GB = 1e9


@dataclass
class Speed:
    """What ddp is priced against one device with, all measured on this machine."""

    step_seconds: float | None  # one training step of the whole batch on one device (None: not measured)
    busbw_gbs: float | None  # all-reduce bus bandwidth over this machine's devices (None: not measured)
    unknown: str | None = None  # why these cannot price the planned devices (None: they can)


def diagnose(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    plan, batch = cfg.doctor, cfg.data.batch_size
    check_plan(plan)  # all of them before anything is measured: a bad one was a traceback after seconds of it
    check_model_settings(cfg)
    precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)  # as train resolves `auto`
    env = hardware.environment()
    gpus = env["gpus"]
    per_node = plan.devices or len(gpus) or 1
    memory_gb = plan.device_memory_gb or (min(g["memory_gb"] for g in gpus) if gpus else env["host_memory_gb"])
    # doctor.devices or doctor.device_memory_gb plan for devices that are not (all) this machine's: what is
    # measured here (a step, the bandwidth, the links) does not describe them.
    elsewhere = plan.device_memory_gb is not None or plan.devices not in (None, len(gpus) or 1)
    sizes = [int(mb * 2**20) for mb in plan.allreduce.sizes_mb]
    bandwidth = hardware.measure_allreduce(sizes, plan.allreduce.iterations) if sizes else None
    # The largest message comes closest to what the links sustain: it prices the gradient all-reduce.
    busbw = bandwidth["sizes"][-1]["busbw_gbs"] if bandwidth else None

    pipeline_preset = OmegaConf.load(CONFIG_DIR / "strategy" / "pipeline.yaml").strategy
    pipe = cfg.strategy if "microbatches" in cfg.strategy else pipeline_preset
    counts = sorted(set(plan.device_counts))
    stage_counts = sorted({*counts, *range(2, per_node + 1)} - {1})
    facts = model_facts(cfg, batch, stage_counts, precision)

    memory = []
    for preset in PRESETS:
        for n in counts:
            nbytes, holds = memory_per_device(facts, preset, n, per_node, batch, pipe.microbatches, pipe.schedule)
            row = {"preset": preset, "devices": n, "bytes": nbytes, "holds": holds}
            if preset == "dp" and nbytes is not None and n > 1:  # device 0 fills first: the others need less
                row["other_devices_bytes"] = dp_memory(facts, n, batch)[1]
            memory.append(row)
    traffic = [gradient_traffic(facts.parameters, n, busbw) for n in counts if n > 1]
    step = step_seconds(cfg, facts, batch, env["host_memory_gb"], precision)
    topology = hardware.topology(gpus)
    # Tensor parallelism all-reduces in every block: without NVLink/NVSwitch between the GPUs, prefer a pipeline.
    pairs = topology["pairs"]  # none without 2+ GPUs: then the links are unknown
    pcie_only = None if elsewhere or not pairs else not any(p["nvlinks"] or p["nvswitch_links"] for p in pairs)
    speed = Speed(step, busbw, unpriced(step, busbw, elsewhere, per_node, memory_gb))
    usable = USABLE * memory_gb * GB
    given = next((o.partition("=")[2] for o in overrides if o.startswith("strategy=")), None)
    own = (given, built_in_preset(given, cfg.strategy)) if given else None  # a preset file of yours: what it is
    advice = recommend(facts, usable, per_node, plan, batch, pipe, speed, pcie_only, overrides, own)
    return {
        "environment": env,
        "topology": topology,
        "allreduce": bandwidth,
        "model": {
            "net": cfg.model.net._target_,
            "parameters": facts.parameters,
            "optimizer_state_bytes_per_parameter": facts.optimizer_state_per_parameter,
            "activation_bytes_per_sample": facts.activation_bytes_per_sample,
            "output_bytes_per_sample": facts.output_bytes_per_sample,
            "tensor_parallel_parameters": facts.tensor_parallel_parameters,
            "global_batch": batch,
            "precision": precision,
            "step_seconds_one_device": step,
        },
        "plan": {
            "devices_per_node": per_node,
            "device_memory_gb": memory_gb,
            "usable_share": USABLE,
            "this_machine": not elsewhere,
        },
        "memory": memory,
        "traffic": traffic,
        "recommendation": advice,
    }


def check_plan(plan: DictConfig) -> None:
    """Refuse, in one line, a doctor.* setting that cannot work (tools.settings says which values are valid)."""
    settings_group("doctor", plan, "doctor.devices=2")
    settings_group("doctor.allreduce", plan.allreduce, "doctor.allreduce.sizes_mb=[] (no measurement)")
    if plan.devices is not None:  # (null's default: any text passes the command line's type check)
        whole_number("doctor.devices", plan.devices, 1, "devices per node")
    if plan.device_memory_gb is not None:
        number("doctor.device_memory_gb", plan.device_memory_gb, 0, "GB per device", above=True)
    whole_number("doctor.max_nodes", plan.max_nodes, 1, "the most nodes a recommendation may use")
    number_list("doctor.device_counts", plan.device_counts, "device counts", "[1,2,4,8]", True, 1, empty=False)
    speedup = "how many times faster than one device ddp must be to be recommended, e.g. 1.2"
    number("doctor.min_speedup", plan.min_speedup, 1, speedup)
    sizes = "[0.25,2,16] ([] skips the measurement)"
    number_list("doctor.allreduce.sizes_mb", plan.allreduce.sizes_mb, "message sizes in MB", sizes, False, 0, True)
    whole_number("doctor.allreduce.iterations", plan.allreduce.iterations, 1, "timed all-reduces per message size")


def unpriced(step: float | None, busbw: float | None, elsewhere: bool, per_node: int, memory_gb: float) -> str | None:
    """Why ddp's speed-up over one device cannot be estimated from what was measured here; None if it can."""
    if elsewhere:
        return (
            f"the step time and the all-reduce bandwidth are this machine's, not those of the planned "
            f"{per_node} x {_size(memory_gb * GB)} devices; run the doctor (or bench scaling) on them"
        )
    if step is None:
        return "one step was not measured (the model does not fit on this machine)"
    if busbw is None:
        return "the all-reduce bandwidth was not measured (doctor.allreduce.sizes_mb=[])"
    return None


def step_seconds(cfg: DictConfig, facts: ModelFacts, batch: int, host_memory_gb: float, precision: str) -> float | None:
    """One training step (forward, backward, optimizer) of the whole batch on this machine's first device, at the
    training's precision (autocast, TF32 as tf32 says), the median of 3 after a warm-up; None when the model
    would not fit here (on CPU: in a quarter of the RAM)."""
    on_gpu = cfg.trainer.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    real_gb = torch.cuda.get_device_properties(0).total_memory / GB if on_gpu else host_memory_gb / 4
    if facts.state_bytes + facts.activation_bytes_per_sample * batch > USABLE * real_gb * GB:
        return None
    use_tensor_cores(cfg.tf32)
    torch.manual_seed(cfg.seed)
    net = build_object(cfg.model.net).to(device)
    optimizer = build_object(cfg.model.optimizer)(net.parameters())
    shape = (batch, *facts.sample.shape)  # shaped like the data's samples
    if facts.sample.dtype == torch.long:  # token ids
        x = torch.randint(cfg.data.num_classes, shape, device=device)
    else:
        x = torch.randn(shape, device=device)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    times, y = [], None
    for _ in range(4):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out = net(x)
        if y is None:  # a target per output position: one per sample, or one per token
            y = torch.randint(out.shape[-1], out.shape[:-1], device=device) if out.dim() > 1 else None
        # cross-entropy over the logits, as the training's; a model of values (regression): their mean square
        loss = out.float().square().mean() if y is None else F.cross_entropy(out.flatten(0, -2).float(), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


LAYOUT_SETTINGS = ("strategy=", "strategy.", "trainer.devices=", "trainer.num_nodes=")  # what a recommendation sets


def recommend(
    facts: ModelFacts,
    usable: float,
    per_node: int,
    plan: DictConfig,
    batch: int,
    pipe: DictConfig,
    speed: Speed,
    pcie_only: bool | None,
    overrides: list[str],
    own: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The decision tree: one device if it fits and ddp would not be much faster; ddp if a replica fits on each
    device; else split the model over the fewest devices that hold it (model_parallel, or pipeline where GPUs
    talk over PCIe only), on one node if possible, else over nodes.

    `usable`: bytes per device a plan may fill; `pipe`: the pipeline's microbatches and schedule; `pcie_only`:
    whether the GPUs are linked by PCIe only (None: not known); `own`: the preset the command line gave and the
    built-in one it is (a preset file of yours is recommended by its name where its built-in one is)."""
    plans = Plans(facts, usable, per_node, batch, pipe, overrides, own)
    # Tensor parallelism all-reduces in every block: over PCIe only, a pipeline (point-to-point between stages).
    unknown_links = (
        "; this assumes NVLink or NVSwitch between the GPUs (not seen here): over PCIe only, prefer strategy=pipeline"
        if pcie_only is None
        else ""
    )
    return (
        on_every_device_whole(plans, speed, plan.min_speedup)
        or split_on_one_node(plans, pcie_only, unknown_links)
        or split_over_nodes(plans, plan.max_nodes, unknown_links)
        or nothing_fits(facts, plan.max_nodes, per_node)
    )


@dataclass
class Plans:
    """What the recommendation prices its plans with (the model, the bytes a plan may fill per device, the devices
    of a node, the global batch, the pipeline's settings) and what writes a plan's command (the command line's
    overrides; `own`: the preset it gave and the built-in one it is)."""

    facts: ModelFacts
    usable: float
    per_node: int
    batch: int
    pipe: DictConfig
    overrides: list[str]
    own: tuple[str, str] | None

    def need(self, preset: str, n: int, tensor: int | None = None, pipelines: int = 1) -> float | None:
        micro, schedule = self.pipe.microbatches, self.pipe.schedule
        return memory_per_device(self.facts, preset, n, self.per_node, self.batch, micro, schedule, tensor, pipelines)[
            0
        ]

    def fits(self, preset: str, n: int, tensor: int | None = None) -> bool:
        nbytes = self.need(preset, n, tensor)
        return nbytes is not None and nbytes <= self.usable

    def advice(
        self,
        preset: str,
        devices: int,
        nodes: int,
        why: str,
        extra: tuple[str, ...] = (),
        tensor: int | None = None,
        pipelines: int = 1,
    ) -> dict[str, Any]:
        # The user's own settings, but not those of the layout the recommendation replaces (strategy=ddp twice);
        # the preset's own settings (strategy.X) where it recommends the preset the command line gave
        mine = self.own is not None and self.own[1] == preset
        replaced = LAYOUT_SETTINGS if not mine else tuple(o for o in LAYOUT_SETTINGS if o != "strategy.")
        kept = [o for o in self.overrides if not o.lstrip("+~").startswith(replaced)]
        if self.facts.unused and preset in ("ddp", "ddp_spawn"):  # DDP stops at the first step otherwise
            extra = (*extra, "strategy.find_unused_parameters=true")
        name = self.own[0] if self.own and mine else preset
        command = train_command(name, devices, nodes, [*extra, *kept], kind=preset)
        return {
            "preset": preset,
            "devices_per_node": devices,
            "nodes": nodes,
            "bytes_per_device": self.need(preset, devices * nodes, tensor, pipelines),
            "why": why,
            "command": " ".join(command),
        }


def on_every_device_whole(plans: Plans, speed: Speed, min_speedup: float) -> dict[str, Any] | None:
    """single or ddp, where the whole model fits on one device; None where it does not."""
    batch, per_node = plans.batch, plans.per_node
    data_parallel = max((n for n in range(1, per_node + 1) if batch % n == 0), default=1)
    # Said wherever ddp is recommended over fewer devices than the node has
    not_all = (
        f" (over {data_parallel} of the {per_node}: data.batch_size={batch}, the global batch, does not divide over "
        f"{per_node}; give a multiple of {per_node} to train on all of them)"
        if 1 < data_parallel < per_node
        else ""
    )
    if not plans.fits("single", 1):
        if plans.fits("ddp", data_parallel):
            why = f"one replica plus its share of the batch fits on each device{not_all}"
            return plans.advice("ddp", data_parallel, 1, why)
        return None
    if data_parallel == 1 and per_node == 1:
        return plans.advice("single", 1, 1, "the model fits on one device and there is one device to use")
    if data_parallel == 1:
        why = (
            f"the model fits on one device, and data.batch_size={batch} (the global batch) divides over none of "
            f"the other device counts up to {per_node}: give a multiple of {per_node} to train on all of them"
        )
        return plans.advice("single", 1, 1, why)
    if plans.need("ddp", data_parallel) is None:  # a lazy layer, which ddp takes the net before the first forward sizes
        pipe = plans.pipe
        held = memory_per_device(plans.facts, "ddp", data_parallel, per_node, batch, pipe.microbatches, pipe.schedule)
        why = f"the model fits on one device, and {held[1]}; give that layer its sizes to train on {data_parallel}"
        return plans.advice("single", 1, 1, why)
    if speed.unknown:
        why = f"a replica fits on each device{not_all}; ddp's speed-up over one device is not estimated: "
        return plans.advice("ddp", data_parallel, 1, why + speed.unknown)
    step = speed.step_seconds
    all_reduce = gradient_traffic(plans.facts.parameters, data_parallel, speed.busbw_gbs)["ring_seconds"]
    speedup = step / (step / data_parallel + all_reduce)
    basis = (
        f"measured here: one step {step * 1e3:.1f} ms on one device, the gradients' ring all-reduce "
        f"{all_reduce * 1e3:.1f} ms at {speed.busbw_gbs:.3g} GB/s; assumed: the batch splits evenly "
        f"and the all-reduce does not overlap the backward"
    )
    if speedup < min_speedup:
        why = f"it fits on one device and ddp over {data_parallel} would be only {speedup:.2f}x faster"
        return {**plans.advice("single", 1, 1, why), "basis": basis}
    why = f"it fits on one device; ddp over {data_parallel} is ~{speedup:.1f}x faster{not_all}"
    return {**plans.advice("ddp", data_parallel, 1, why), "basis": basis}


def split_on_one_node(plans: Plans, pcie_only: bool | None, unknown_links: str) -> dict[str, Any] | None:
    """fsdp, model_parallel or pipeline over the fewest devices of one node that hold the model (then every device
    of the node); None where no such split fits."""
    per_node = plans.per_node
    for n in range(2, per_node + 1):
        split_fits = plans.fits("pipeline", n)
        if plans.fits("fsdp", per_node) and not (pcie_only and split_fits):
            # Data parallel still, over every device of the node, each holding 1/N of the model: no tensor-parallel
            # collective in every block, for any model (model_parallel needs a tensor-parallel plan).
            why = f"a replica does not fit on one device; sharded over all {per_node} by FSDP2 it does"
            return plans.advice("fsdp", per_node, 1, why)
        if plans.fits("model_parallel", n) and not (pcie_only and split_fits):
            # Every device of the node: the smallest tensor-parallel group that fits (the least communication per
            # block), FSDP2 over the rest, which shards weights and optimizer state further.
            tensor = min(
                t for t in range(1, per_node + 1) if per_node % t == 0 and plans.fits("model_parallel", per_node, t)
            )
            data = per_node // tensor
            why = f"it fits sharded over {n}; over all {per_node}: mesh dp={data} (FSDP2) x tp={tensor}{unknown_links}"
            extra = (f"strategy.tensor_parallel_size={tensor}", f"strategy.data_parallel_size={data}")
            return plans.advice("model_parallel", per_node, 1, why, extra, tensor)
        if split_fits:
            return pipeline_advice(plans, n, pcie_only)
    return None


def pipeline_advice(plans: Plans, stages: int, pcie_only: bool | None) -> dict[str, Any]:
    """The model cut into `stages`, as many such pipelines side by side as the node's devices and the batch allow."""
    bounds = split_blocks(plans.facts.blocks, stages)
    points = [r.start for r in bounds[1:]]
    split = ", ".join(f"stage {i}: blocks {r.start}-{r.stop - 1}" for i, r in enumerate(bounds))
    link = "GPUs linked by PCIe only: " if pcie_only else ""
    # The node's other devices run more pipelines side by side, data parallel (each a share of the batch).
    micro = plans.pipe.microbatches
    pipelines = max(r for r in range(1, plans.per_node // stages + 1) if plans.batch % (micro * r) == 0)
    extra = (f"strategy.split_points=[{','.join(map(str, points))}]",)
    side_by_side = ""
    if pipelines > 1:
        extra += (f"strategy.data_parallel_size={pipelines}",)
        side_by_side = f"; {pipelines} such pipelines side by side use all {stages * pipelines} devices"
    why = f"{link}cut into {stages} stages ({split}), {micro} micro-batches, it fits{side_by_side}"
    return plans.advice("pipeline", stages * pipelines, 1, why, extra, pipelines=pipelines)


def split_over_nodes(plans: Plans, max_nodes: int, unknown_links: str) -> dict[str, Any] | None:
    """model_parallel over the fewest nodes that hold the model; None where not even doctor.max_nodes do."""
    for nodes in range(2, max_nodes + 1):
        if plans.fits("model_parallel", nodes * plans.per_node):
            data, tensor = mesh(nodes * plans.per_node, plans.per_node)
            why = f"it needs {nodes} nodes: tensor parallel x{tensor} inside each node, FSDP over {data} replicas"
            return plans.advice("model_parallel", plans.per_node, nodes, why + unknown_links)
    return None


def nothing_fits(facts: ModelFacts, max_nodes: int, per_node: int) -> dict[str, Any]:
    """No preset: why, and what to change."""
    if facts.lazy:  # more nodes cannot help either: every preset that shards the model refuses a lazy layer
        return {
            "preset": None,
            "why": f"a replica does not fit on one device, and fsdp, model_parallel and pipeline, which would shard "
            f"it, take the net before its first forward sizes {facts.lazy} (a lazy layer): give the layer its sizes",
            "command": None,
        }
    if facts.batchnorm:  # more nodes cannot help: every preset that shards the model refuses BatchNorm
        return {
            "preset": None,
            "why": "with BatchNorm, fsdp, model_parallel's tensor mode and pipeline refuse it, and single and ddp hold "
            "the whole model on each device, which does not fit one; use a smaller data.batch_size or a smaller model, "
            "a norm that shards (LayerNorm, GroupNorm), or model_parallel strategy.mode=layers (its layers spread "
            "over one machine's devices; not priced here)",
            "command": None,
        }
    # FSDP2 (fsdp, model_parallel's data parallelism) could have sharded it over more devices, with one dimension more
    scalar = f" (fsdp could shard it if the 0-dim parameter {facts.scalar} had one dimension)" * bool(facts.scalar)
    return {
        "preset": None,
        "why": f"it does not fit even on {max_nodes} nodes x {per_node} devices{scalar}; use a smaller "
        "data.batch_size, a smaller model, or more nodes (doctor.max_nodes)",
        "command": None,
    }


def show(report: dict[str, Any], console: Console) -> None:
    env, topo = report["environment"], report["topology"]
    table = Table(title="Environment")
    for key in ("torch", "cuda", "nccl", "driver", "hostname", "cpu_count"):
        table.add_row(key, str(env[key]))
    table.add_row("host memory", f"{env['host_memory_gb']:.1f} GB")
    console.print(table)
    if env["gpus"]:
        table = Table("GPU", "name", "memory", "capability", "bf16", "used", "util", "NUMA", title="Devices")
        for g in env["gpus"]:
            table.add_row(
                str(g["index"]),
                g["name"],
                f"{g['memory_gb']:.1f} GB",
                g["compute_capability"],
                str(g["bf16"]),
                _size(g["memory_used_gb"] * GB if g.get("memory_used_gb") is not None else None),
                f"{g.get('utilization_percent')}%",
                str(g.get("numa_node")),
            )
        console.print(table)
    else:
        console.print(f"Devices: none ({env['why_no_gpus']})")
    if topo["pairs"]:
        table = Table("GPUs", "link", "PCIe path", "same socket", "P2P", title="Topology (NVML)")
        for p in topo["pairs"]:
            table.add_row(
                f"{p['gpus'][0]}-{p['gpus'][1]}", p["link"], str(p["pcie_path"]), str(p["same_socket"]), str(p["p2p"])
            )
        console.print(table)
    else:
        console.print(f"Topology: none ({topo['why_empty']})")
    console.print(f"NCCL environment: {topo['nccl_env'] or 'no NCCL_* variables set'}")

    bw = report["allreduce"]
    if bw is None:
        console.print("All-reduce: not measured (doctor.allreduce.sizes_mb=[])")
    else:
        title = f"All-reduce ({bw['backend']}, {bw['processes']} processes; busbw = algbw x 2(n-1)/n)"
        table = Table("size", "time", "algbw GB/s", "busbw GB/s", title=title)
        for row in bw["sizes"]:
            table.add_row(
                f"{row['bytes'] / 2**20:g} MiB",
                f"{row['time_us']:.0f} us",
                f"{row['algbw_gbs']:.2f}",
                f"{row['busbw_gbs']:.2f}",
            )
        console.print(table)

    model, plan = report["model"], report["plan"]
    step = model["step_seconds_one_device"]
    console.print(
        f"Model {model['net']}: {model['parameters']:,} parameters, optimizer state "
        f"{model['optimizer_state_bytes_per_parameter']} B/parameter, "
        f"activations ~{_size(model['activation_bytes_per_sample'])}/sample "
        f"({model['precision']}), global batch {model['global_batch']}; one step on one device: "
        + (f"{step * 1e3:.1f} ms" if step is not None else "not measured (does not fit here)")
    )
    counts = sorted({row["devices"] for row in report["memory"]})
    table = Table(
        "preset",
        *(f"{n} device{'s' * (n > 1)}" for n in counts),
        title=f"Memory per device (plan: {plan['devices_per_node']} x {_size(plan['device_memory_gb'] * GB)} per node"
        + ("" if plan["this_machine"] else ", not this machine's")
        + ")",
    )
    for preset in PRESETS:
        cells = {row["devices"]: row for row in report["memory"] if row["preset"] == preset}
        table.add_row(preset, *(_size(cells[n]["bytes"]) for n in counts))
    console.print(table)
    held = [row["holds"] for row in report["memory"]]
    for why in dict.fromkeys(why for why in held if any(refusal in why for refusal in NOT_MEMORY)):
        console.print(f"  -: {why}")  # what a "-" means when it is not memory
    if unequal := [row for row in report["memory"] if "other_devices_bytes" in row]:
        row = unequal[-1]
        console.print(
            f"dp fills device 0 first: over {row['devices']} devices it needs {_size(row['bytes'])}, each other "
            f"device {_size(row['other_devices_bytes'])} ({DP_DEVICE_0})"
        )
    table = Table(
        "devices",
        "gradients",
        "ring per device 2(N/P)(P-1)",
        "time",
        "parameter server N(P-1)",
        "time",
        title="Gradient traffic per step, at the bus bandwidth measured here",
    )
    for row in report["traffic"]:
        table.add_row(
            str(row["devices"]),
            _size(row["gradient_bytes"]),
            _size(row["ring_bytes_per_device"]),
            _ms(row["ring_seconds"]),
            _size(row["parameter_server_bytes"]),
            _ms(row["parameter_server_seconds"]),
        )
    console.print(table)
    advice = report["recommendation"]
    console.print(f"[bold]Recommendation:[/bold] {advice['preset'] or 'none fits'}: {advice['why']}")
    if advice.get("basis"):
        console.print(f"  ({advice['basis']})")
    if advice["command"]:
        console.print(f"  {advice['command']}", soft_wrap=True)


def _size(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


@hydra.main(version_base="1.3", config_path="configs", config_name="doctor")
def run(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    overrides = [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(("doctor.", "hydra."))]
    try:
        report = diagnose(cfg, overrides)
    except ConfigError as err:
        fail(err, run_dir)
    except UNRESOLVED as err:  # e.g. data=files with a bad data.dir
        fail(unresolved(err), run_dir)
    show(report, Console())
    path = run_dir / "doctor.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"doctor: report written to {path}")


def main() -> None:
    run_cli(run, "doctor")


if __name__ == "__main__":
    main()
