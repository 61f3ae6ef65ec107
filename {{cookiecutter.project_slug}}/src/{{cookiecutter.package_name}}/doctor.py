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
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from . import hardware
from .commands import train_command
from .config import CONFIG_DIR, UNRESOLVED, ConfigError, fail, register_resolvers, run_cli, unresolved
from .estimate import USABLE, ModelFacts, gradient_traffic, memory_per_device, mesh, model_facts
from .model_split import split_blocks

register_resolvers()

PRESETS = ("single", "ddp", "dp", "model_parallel", "pipeline")
GB = 1e9


def diagnose(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    plan, batch = cfg.doctor, cfg.data.batch_size
    if plan.device_memory_gb is not None and plan.device_memory_gb <= 0:
        raise ConfigError(f"doctor.device_memory_gb={plan.device_memory_gb} must be > 0 (GB per device)")
    if plan.devices is not None and plan.devices < 1:
        raise ConfigError(f"doctor.devices={plan.devices} must be >= 1 (devices per node)")
    env = hardware.environment()
    gpus = env["gpus"]
    per_node = plan.devices or len(gpus) or 1
    memory_gb = plan.device_memory_gb or (min(g["memory_gb"] for g in gpus) if gpus else env["host_memory_gb"])
    sizes = [int(mb * 2**20) for mb in plan.allreduce.sizes_mb]
    bandwidth = hardware.measure_allreduce(sizes, plan.allreduce.iterations) if sizes else None
    # The largest message comes closest to what the links sustain: it prices the gradient all-reduce.
    busbw = bandwidth["sizes"][-1]["busbw_gbs"] if bandwidth else None

    pipeline_preset = OmegaConf.load(CONFIG_DIR / "strategy" / "pipeline.yaml").strategy
    pipe = cfg.strategy if "microbatches" in cfg.strategy else pipeline_preset
    microbatches, schedule = pipe.microbatches, pipe.schedule
    counts = sorted(set(plan.device_counts))
    stage_counts = sorted({*counts, *range(2, per_node + 1)} - {1})
    facts = model_facts(cfg, example_input(cfg, batch), stage_counts)

    def need(preset: str, devices: int, tensor: int | None = None) -> tuple[float | None, str]:
        return memory_per_device(facts, preset, devices, per_node, batch, microbatches, schedule, tensor)

    memory = [
        {"preset": preset, "devices": n, "bytes": need(preset, n)[0], "holds": need(preset, n)[1]}
        for preset in PRESETS
        for n in counts
    ]
    traffic = [gradient_traffic(facts.parameters, n, busbw) for n in counts if n > 1]
    step = step_seconds(cfg, facts, batch, env["host_memory_gb"])
    usable = USABLE * memory_gb * GB
    topology = hardware.topology()
    # Tensor parallelism all-reduces in every block: without NVLink/NVSwitch between the GPUs, prefer a pipeline.
    pairs = topology["pairs"]  # none without 2+ GPUs: then nothing is known against tensor parallelism
    pcie_only = bool(pairs) and not any(p["nvlinks"] or p["nvswitch_links"] for p in pairs)
    advice = recommend(need, facts, usable, per_node, plan, batch, step, busbw, microbatches, pcie_only, overrides)
    return {
        "environment": env,
        "topology": topology,
        "allreduce": bandwidth,
        "model": {
            "net": cfg.model.net._target_,
            "parameters": facts.parameters,
            "optimizer_state_bytes_per_parameter": facts.optimizer_state_per_parameter,
            "activation_bytes_per_sample": facts.activation_bytes_per_sample,
            "tensor_parallel_parameters": facts.tensor_parallel_parameters,
            "global_batch": batch,
            "precision": str(cfg.trainer.precision),
            "step_seconds_one_device": step,
        },
        "plan": {"devices_per_node": per_node, "device_memory_gb": memory_gb, "usable_share": USABLE},
        "memory": memory,
        "traffic": traffic,
        "recommendation": advice,
    }


def example_input(cfg: DictConfig, batch: int) -> torch.Tensor:
    """A meta batch shaped like the data's inputs: num_features values per sample (token ids for data=tokens)."""
    if "num_features" not in cfg.data:
        raise ConfigError("the doctor sizes the model from data.num_features; this data config has none")
    return torch.zeros(batch, cfg.data.num_features, dtype=input_dtype(cfg), device="meta")


def input_dtype(cfg: DictConfig) -> torch.dtype:
    """Token ids (int64) for a language model's data (data=tokens has a vocab_size), else float32 features."""
    return torch.long if "vocab_size" in cfg.data else torch.float32


def step_seconds(cfg: DictConfig, facts: ModelFacts, batch: int, host_memory_gb: float) -> float | None:
    """One training step (forward, backward, optimizer) of the whole batch on this machine's first device, the
    median of 3 after a warm-up; None when the model would not fit here (on CPU: in a quarter of the RAM)."""
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    real_gb = torch.cuda.get_device_properties(0).total_memory / GB if device.type == "cuda" else host_memory_gb / 4
    if facts.state_bytes + facts.activation_bytes_per_sample * batch > USABLE * real_gb * GB:
        return None
    torch.manual_seed(cfg.seed)
    net = instantiate(cfg.model.net).to(device)
    optimizer = instantiate(cfg.model.optimizer)(net.parameters())
    if input_dtype(cfg) == torch.long:  # a language model: a token per position in, the next token per position out
        x = torch.randint(cfg.data.num_classes, (batch, cfg.data.num_features), device=device)
        y = torch.randint(cfg.data.num_classes, x.shape, device=device)
    else:
        x = torch.randn(batch, cfg.data.num_features, device=device)
        y = torch.randint(cfg.data.num_classes, (batch,), device=device)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        F.cross_entropy(net(x).flatten(0, -2), y.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def recommend(
    need: Any,
    facts: ModelFacts,
    usable: float,
    per_node: int,
    plan: DictConfig,
    batch: int,
    step: float | None,
    busbw: float | None,
    microbatches: int,
    pcie_only: bool,
    overrides: list[str],
) -> dict[str, Any]:
    """The decision tree: one device if it fits and ddp would not be much faster; ddp if a replica fits on each
    device; else split the model over the fewest devices that hold it (model_parallel, or pipeline where GPUs
    talk over PCIe only), on one node if possible, else over nodes."""

    def fits(preset: str, n: int, tensor: int | None = None) -> bool:
        nbytes = need(preset, n, tensor)[0]
        return nbytes is not None and nbytes <= usable

    def advice(
        preset: str, devices: int, nodes: int, why: str, extra: tuple[str, ...] = (), tensor: int | None = None
    ) -> dict[str, Any]:
        command = train_command(preset, devices, nodes, [*extra, *overrides])
        return {
            "preset": preset,
            "devices_per_node": devices,
            "nodes": nodes,
            "bytes_per_device": need(preset, devices * nodes, tensor)[0],
            "why": why,
            "command": " ".join(command),
        }

    data_parallel = max((n for n in range(1, per_node + 1) if batch % n == 0), default=1)
    if fits("single", 1):
        if data_parallel == 1:
            return advice("single", 1, 1, "the model fits on one device and there is one device to use")
        if step is None:
            return advice("ddp", data_parallel, 1, "a replica fits on each device; data parallel is the default")
        all_reduce = gradient_traffic(facts.parameters, data_parallel, busbw)["ring_seconds"] or 0.0  # unmeasured: 0
        ddp_step = step / data_parallel + all_reduce
        speedup = step / ddp_step
        if speedup < plan.min_speedup:
            return advice(
                "single",
                1,
                1,
                f"it fits on one device and ddp over {data_parallel} would be only {speedup:.2f}x "
                f"faster (step {step * 1e3:.1f} ms; all-reduce {all_reduce * 1e3:.1f} ms)",
            )
        return advice(
            "ddp", data_parallel, 1, f"it fits on one device; ddp over {data_parallel} is ~{speedup:.1f}x faster"
        )
    if fits("ddp", data_parallel):
        return advice("ddp", data_parallel, 1, "one replica plus its share of the batch fits on each device")
    for n in range(2, per_node + 1):
        split_fits = fits("pipeline", n)
        if fits("model_parallel", n) and not (pcie_only and split_fits):
            # Every device of the node: the smallest tensor-parallel group that fits (the least communication per
            # block), FSDP2 over the rest, which shards weights and optimizer state further.
            tensor = min(t for t in range(1, per_node + 1) if per_node % t == 0 and fits("model_parallel", per_node, t))
            data = per_node // tensor
            return advice(
                "model_parallel",
                per_node,
                1,
                f"it fits sharded over {n}; over all {per_node}: mesh dp={data} (FSDP2) x tp={tensor}",
                (f"strategy.tensor_parallel_size={tensor}", f"strategy.data_parallel_size={data}"),
                tensor,
            )
        if split_fits:
            bounds = split_blocks(facts.blocks, n)
            points = [r.start for r in bounds[1:]]
            split = ", ".join(f"stage {i}: blocks {r.start}-{r.stop - 1}" for i, r in enumerate(bounds))
            link = "GPUs linked by PCIe only: " if pcie_only else ""
            return advice(
                "pipeline",
                n,
                1,
                f"{link}cut into {n} stages ({split}), {microbatches} micro-batches, it fits",
                (f"strategy.split_points=[{','.join(map(str, points))}]",),
            )
    for nodes in range(2, plan.max_nodes + 1):
        if fits("model_parallel", nodes * per_node):
            data, tensor = mesh(nodes * per_node, per_node)
            return advice(
                "model_parallel",
                per_node,
                nodes,
                f"it needs {nodes} nodes: tensor parallel x{tensor} inside each node, FSDP over {data} replicas",
            )
    return {
        "preset": None,
        "why": f"it does not fit even on {plan.max_nodes} nodes x {per_node} devices; use a smaller data.batch_size, "
        "a smaller model, or more nodes (doctor.max_nodes)",
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
        title=f"Memory per device (plan: {plan['devices_per_node']} x {_size(plan['device_memory_gb'] * GB)} per node)",
    )
    for preset in PRESETS:
        cells = {row["devices"]: row for row in report["memory"] if row["preset"] == preset}
        table.add_row(preset, *(_size(cells[n]["bytes"]) for n in counts))
    console.print(table)
    table = Table(
        "devices",
        "gradients",
        "ring per device 2(N/P)(P-1)",
        "time",
        "parameter server N(P-1)",
        "time",
        title="Gradient traffic per step, at the measured bus bandwidth",
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
    run_cli(run)


if __name__ == "__main__":
    main()
