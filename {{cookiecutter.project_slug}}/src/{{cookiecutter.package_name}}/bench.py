"""Two benchmarks of the training as configured. Each point is the real training command (the one the doctor
prints) with a few steps, run through `steptimes`, which records when every optimizer step ends and the peak memory.

`python -m {{ cookiecutter.package_name }}.bench scaling [train overrides, bench.devices=[1,2,4]]`: how a preset scales.
Throughput is the timed steps' samples over their time, after
bench.warmup_steps. One process is `strategy=single` (the baseline every point is compared with).
- ddp, ddp_spawn, dp, fsdp: WEAK scaling, the convention for data parallelism: each device keeps data.batch_size
  samples, so the global batch grows with the processes (N x data.batch_size). Linear = N x one device.
- model_parallel, pipeline: STRONG scaling: one model replica, the global batch stays data.batch_size.
  pipeline runs every schedule (the looped ones where the net has the blocks for 2 stages per process; zbv
  without compile=true) and puts the measured idle share (pipeline/idle_fraction) next to the theoretical bubble,
  (p-1)/(m+p-1), (p-1)/(2m+p-1) for interleaved_1f1b, none for zbv (pipelining.bubble_fraction).
A model that predicts every position of a sequence (model=gpt) also gets tokens/s: samples/s x positions per
sample. On GPUs it also reports model FLOPs utilisation: 6 x parameters FLOPs per predicted token (forward 2,
backward 4: the dense-network estimate; it ignores attention and normalisation; a classifier's sample is one
token) over the devices' peak at the precision training uses (trainer.precision=auto resolved as train does).
Writes scaling.csv and scaling.png into its run folder and logs both (a table, a chart) to one wandb run.

`python -m {{ cookiecutter.package_name }}.bench memory [train overrides]`: what activation checkpointing buys, on one
device. For each of bench.activation_checkpointing (none, full, selective) it times data.batch_size and reports the
step time, tokens/s, MFU and peak memory (GPU: allocated by tensors; CPU: the process's resident memory), then,
with bench.find_batch, runs the batch-size finder (up to bench.max_batch_size) and reports the largest batch that
fits. Writes memory.csv and logs it to wandb as a table.
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
import torch
import wandb
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from .config.command_line import run_cli
from .config.objects import build_object, register_resolvers, unresolved
from .data.loading import Data
from .engine.launching import train_command, trial_command
from .errors import UNRESOLVED, ConfigError, fail
from .models.activation_checkpointing import MODES, check_activation_checkpointing
from .parallel.pipelining import LOOPED, SCHEDULES, bubble_fraction, check_stages_per_process, split_backward_blocker
from .parallel.presets import built_in_preset
from .parallel.split import layers
from .runtime.precision import resolve_precision
from .tools.estimate import check_model_settings, count_parameters, example_input, tokens_per_sample, training_split
from .tools.settings import number, number_list, settings_group, shown, whole_number
from .tools.steptimes import ENV, STEPS_ENV, WARMUP_ENV, progress_file
from .tracking.wandb_run import finish_wandb, wandb_mode

register_resolvers()

DATA_PARALLEL = ("ddp", "ddp_spawn", "dp", "fsdp")
# Set by the bench for every point; the user's values of these are not passed on.
OWN_KEYS = ("strategy=", "trainer.devices=", "trainer.max_steps=", "data.batch_size=", "data.train_size=", "logger=")
# Dense bf16 tensor-core peaks (TFLOPS) of common GPUs, for MFU when bench.peak_tflops is not set.
# Dense bf16 peak TFLOP/s of one GPU, from NVIDIA's data sheets, by the name torch reports; the most specific name
# first: an "H100 PCIe" (756) or "H100 NVL" (835) is not an H100 SXM ("NVIDIA H100 80GB HBM3", 989).
PEAK_BF16_TFLOPS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H200 NVL", 835.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
]


class PointFailed(RuntimeError):
    """A point's training failed: its output is printed above."""


def scaling(cfg: DictConfig, overrides: list[str], run_dir: Path, console: Console) -> list[dict[str, Any]]:
    check_settings(cfg)
    devices = cfg.bench.devices
    counts = [] if devices is None else number_list("bench.devices", devices, "process counts", "[1,2,4]", True, 1)
    counts = counts or default_counts()  # null or []: 1, 2, 4, ... up to the GPUs here
    choice = HydraConfig.get().runtime.choices["strategy"]
    preset = built_in_preset(choice, cfg.strategy)  # a preset file of yours: the built-in one it is
    if preset == "single" and max(counts) > 1:  # (its points of N processes trained one: a made-up efficiency)
        raise ConfigError(
            f"bench scaling measures a preset over several processes; strategy={choice} trains one: give "
            "strategy=ddp (or ddp_spawn, dp, fsdp, model_parallel, pipeline), or bench.devices=[1]"
        )
    weak = preset in DATA_PARALLEL
    split = training_split(cfg)  # built once: a dataset of yours may read files for minutes
    check_one_epoch(cfg, {n: cfg.data.batch_size * (n if weak else 1) for n in counts}, split)
    net, parameters, tokens, peak = model_figures(cfg, split)
    check_largest_point(cfg, preset, max(counts), weak)
    console.print(
        f"bench scaling: strategy={choice}, {'weak' if weak else 'strong'} scaling "
        + (f"(global batch = N x {cfg.data.batch_size})" if weak else f"(global batch {cfg.data.batch_size})")
    )
    rows: list[dict[str, Any]] = []
    for n in sorted(set(counts)):
        schedules = pipeline_schedules(cfg, net, n) if preset == "pipeline" and n > 1 else [None]
        if preset == "pipeline" and n > 1 and len(schedules) < len(SCHEDULES):
            console.print(f"  {n} processes: {left_out(cfg, net, n, schedules)}")
        for schedule in schedules:
            batch = cfg.data.batch_size * (n if weak else 1)
            point = ("single", None) if n == 1 else (choice, preset)
            times = run_point(cfg, point[0], n, batch, schedule, overrides, run_dir, kind=point[1])
            rows.append(measure(times, n, batch, schedule, cfg, parameters, peak, tokens))
            tokens_per_s = f", {rows[-1]['tokens_per_s']:.0f} tokens/s" if tokens > 1 else ""
            console.print(
                f"  {n} process(es){f' {schedule}' if schedule else ''}: {rows[-1]['samples_per_s']:.0f} samples/s"
                + tokens_per_s
            )
    base = rows[0]["samples_per_s"] / rows[0]["devices"]  # per device, at the smallest count
    for row in rows:
        row["linear_samples_per_s"] = base * row["devices"]
        row["efficiency"] = row["samples_per_s"] / row["linear_samples_per_s"]
    return rows


def model_figures(cfg: DictConfig, split: Data | None = None) -> tuple[torch.nn.Module, int, int, float | None]:
    """The net (on the meta device: shapes only), its parameters, the positions each sample predicts, and one
    device's peak FLOP/s (None: no MFU). `split`: the training split, if built already (training_split)."""
    with torch.device("meta"):
        net = build_object(cfg.model.net)
    example = example_input(cfg, net, 2, split)  # 2: BatchNorm refuses 1; the data read on the CPU, not on meta
    with torch.device("meta"):
        tokens = tokens_per_sample(net(example))
    return net, count_parameters(net), tokens, peak_flops(cfg)


def pipeline_schedules(cfg: DictConfig, net: torch.nn.Module, n: int) -> list[str]:
    """The schedules a pipeline point over n processes runs: every one, but the looped ones where the net has fewer
    blocks than 2 stages per position take, and zbv where compile=true or selective activation checkpointing
    stops it (refused)."""
    blocks, blocker = len(layers(net, "pipeline")[2]), zbv_blocker(cfg)
    return [
        schedule
        for schedule in SCHEDULES
        if (schedule not in LOOPED or blocks >= 2 * positions(cfg, n)) and not (schedule == "zbv" and blocker)
    ]


def left_out(cfg: DictConfig, net: torch.nn.Module, n: int, schedules: list[str]) -> str:
    """Which schedules a pipeline point leaves out, and why (pipeline_schedules)."""
    blocks, reasons, blocker = len(layers(net, "pipeline")[2]), [], zbv_blocker(cfg)
    looped = [schedule for schedule in LOOPED if schedule not in schedules and not (schedule == "zbv" and blocker)]
    if looped:
        reasons.append(f"{', '.join(looped)} left out: {blocks} blocks, fewer than 2 stages per process take")
    if blocker and "zbv" not in schedules:
        reasons.append(f"zbv left out: {blocker}")
    return "; ".join(reasons)


def zbv_blocker(cfg: DictConfig) -> str:
    return split_backward_blocker(cfg.compile, cfg.get("activation_checkpointing", "none"))


def positions(cfg: DictConfig, n: int) -> int:
    """The positions of each pipeline over n processes: what is left of them after the pipelines side by side and
    the tensor-parallel shards the user's strategy settings ask for."""
    strategy = cfg.strategy
    return max(1, n // (strategy.get("data_parallel_size", 1) * strategy.get("tensor_parallel_size", 1)))


def default_counts() -> list[int]:
    """1, 2, 4, ... up to the GPUs here, and their count; without GPUs 1 and 2 CPU processes."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return [1, 2]
    return sorted({*(2**k for k in range(gpus.bit_length()) if 2**k <= gpus), gpus})


def check_settings(cfg: DictConfig) -> None:
    """Refuse, in one line, a bench.* setting both benchmarks read that cannot work (tools.settings says which values
    are valid); each benchmark checks its own too, all before any point runs or anything is written."""
    settings_group("bench", cfg.bench, "bench.steps=20")
    check_model_settings(cfg)  # the training's, of the user's values (not a point's: a weak-scaled batch)
    whole_number("bench.warmup_steps", cfg.bench.warmup_steps, 1, "steps not timed, before the timed ones")
    whole_number("bench.steps", cfg.bench.steps, 2, "timed steps per point")
    if cfg.bench.timeout_s is not None:  # null: no limit
        number("bench.timeout_s", cfg.bench.timeout_s, 0, "one point's limit in seconds; null: none", above=True)
    if cfg.bench.peak_tflops is not None:  # (null's default: any text passes the command line's type check)
        peak = "one device's peak TFLOP/s for MFU, e.g. 989; null: the known GPUs' in bf16"
        number("bench.peak_tflops", cfg.bench.peak_tflops, 0, peak, above=True)


def check_largest_point(cfg: DictConfig, preset: str, n: int, weak: bool) -> None:
    """The training's own checks on the config of the point with the most processes, in this process, before any
    point runs: what the preset refuses (a lazy layer under ddp, a net ddp_spawn cannot pickle) failed that point
    after the others had trained, leaving their folders."""
    if n == 1:
        return
    from .engine.launching import check_trial  # the engine's training: only now, it takes seconds to import

    trial_command(preset, n)  # what the points' launcher needs (the Accelerate engine's: its launch/ config here)

    point = OmegaConf.create(OmegaConf.to_container(cfg))  # (the bench's own settings left in: the checks skip them)
    point.trainer.devices, point.logger = n, None
    point.data.batch_size = cfg.data.batch_size * (n if weak else 1)
    with warnings.catch_warnings():  # about a training that is not run (each point's own are in its output)
        warnings.simplefilter("ignore")
        check_trial(point, preset, n)


def check_one_epoch(cfg: DictConfig, batches: dict[int, int], split: Data | None) -> None:
    """Refuse points whose timed steps would reach the end of the first epoch (its validation and checkpoint would be
    timed as a step: a 2-process point read 96 ms where its steps took 52). `batches`: processes -> global batch.
    The template's datasets are sized for the steps (data.train_size, run_point); one of yours has its own length.
    `split`: the training split (training_split; None: a stream, whose length is not known before it is read)."""
    if "train_size" in cfg.data or split is None:
        return
    try:
        samples = len(split.splits["train"])
    except TypeError:  # a dataset without a length
        return
    steps = cfg.bench.warmup_steps + cfg.bench.steps
    for n, batch in sorted(batches.items()):
        if samples // batch < steps:
            raise ConfigError(
                f"bench: with {n} process(es) the global batch is {batch}, and the training split's {samples} samples "
                f"make {samples // batch} steps of it, fewer than the {steps} run (bench.warmup_steps + bench.steps): "
                "the epoch's end would be timed as a step; lower bench.steps or data.batch_size, or use more samples"
            )


def memory(cfg: DictConfig, overrides: list[str], run_dir: Path, console: Console) -> list[dict[str, Any]]:
    """One row per activation checkpointing mode: data.batch_size timed (step time, peak memory), and the largest
    batch the finder fits (bench.find_batch)."""
    check_settings(cfg)
    modes = cfg.bench.activation_checkpointing
    if not isinstance(modes, ListConfig):  # one mode (full): a list of it is what was meant
        valid, hint = ", ".join(MODES), f"; give a list: [{modes}]" if isinstance(modes, str) else ""
        raise ConfigError(f"bench.activation_checkpointing={shown(modes)} must list modes among {valid}{hint}")
    modes = list(modes)
    if not modes or set(modes) - set(MODES):
        raise ConfigError(f"bench.activation_checkpointing={modes} must list modes among {', '.join(MODES)}")
    if cfg.bench.find_batch:
        whole_number("bench.max_batch_size", cfg.bench.max_batch_size, 1, "per device: the finder searches up to it")
    split = training_split(cfg)  # after the settings' checks: a dataset of yours may take minutes to build
    check_one_epoch(cfg, {1: cfg.data.batch_size}, split)
    net, parameters, tokens, peak = model_figures(cfg, split)
    for mode in modes:  # a net without a Split: refused here, in one line, not by a point's training
        check_activation_checkpointing(net, mode)
    own = [o for o in overrides if not o.startswith(("activation_checkpointing=", "strategy."))]
    console.print(f"bench memory: one device, batch {cfg.data.batch_size}, activation_checkpointing={modes}")
    rows = []
    for mode in modes:
        settings = [*own, f"activation_checkpointing={mode}"]
        times = run_point(cfg, "single", 1, cfg.data.batch_size, None, settings, run_dir, name=mode)
        row = measure(times, 1, cfg.data.batch_size, None, cfg, parameters, peak, tokens)
        row = {"activation_checkpointing": mode, **{k: v for k, v in row.items() if k in MEMORY_COLUMNS}}
        if cfg.bench.find_batch:
            finder = ["oom.find_batch_size=true", f"oom.batch_size_finder.max_batch_size={cfg.bench.max_batch_size}"]
            found = run_point(
                cfg, "single", 1, cfg.data.batch_size, None, [*settings, *finder], run_dir, name=f"{mode}-find_batch",
                steps=1, train_size=2 * max(cfg.bench.max_batch_size, cfg.data.batch_size),
            )  # fmt: skip
            row["largest_batch"] = found["largest_batch"]
        rows.append(row)
        largest = ""
        if cfg.bench.find_batch:
            capped = row["largest_batch"] >= cfg.bench.max_batch_size  # the search's limit, not the memory's
            largest = f", largest batch {row['largest_batch']}" + " (bench.max_batch_size: more may fit)" * capped
        console.print(f"  {mode}: {row['step_ms']:.1f} ms/step, peak {row['peak_memory_mib']:.0f} MiB{largest}")
    return rows


def run_point(
    cfg: DictConfig,
    preset: str,
    n: int,
    batch: int,
    schedule: str | None,
    overrides: list[str],
    run_dir: Path,
    name: str | None = None,
    steps: int | None = None,
    train_size: int | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """Train `preset` on n processes for warm-up + timed steps (or `steps`); what the clock on rank 0 recorded.
    `train_size`: the training split's samples (default: the point's steps, all in one epoch); `kind`: the built-in
    preset a preset file of yours is."""
    name = name or f"{n}" + (f"-{schedule}" if schedule else "")
    point_dir, times_file = run_dir / "points" / name, run_dir / "points" / f"{name}.json"
    steps = steps or cfg.bench.warmup_steps + cfg.bench.steps
    settings = [
        *(o for o in overrides if not dropped(o, preset, schedule)),
        *([f"strategy.schedule={schedule}"] if schedule else []),
        f"data.batch_size={batch}",
        f"trainer.max_steps={steps}",
        "logger=none",  # the bench logs one wandb run; the points none
        "test_after_fit=false",
        f"hydra.run.dir={point_dir}",
    ]
    if "train_size" in cfg.data:  # all steps in one epoch: no validation pause among the timed steps
        settings.append(f"data.train_size={train_size or batch * (steps + 1)}")
    command = train_command(preset, n, 1, settings, module="tools.steptimes", kind=kind)
    if command[:2] == ["accelerate", "launch"]:  # this interpreter's, whatever is on PATH
        command = [sys.executable, "-m", "accelerate.commands.launch", *command[2:]]
    else:
        command = [sys.executable, *command[1:]]
    # Its own session: a point past its limit is stopped with every process its launcher started.
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE,
        env={**os.environ, ENV: str(times_file), STEPS_ENV: str(steps), WARMUP_ENV: str(cfg.bench.warmup_steps)},
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=cfg.bench.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        where = phase(progress_file(times_file), cfg.bench.warmup_steps, steps)
        raise PointFailed(
            f"the point with {n} process(es) ran past bench.timeout_s={cfg.bench.timeout_s} s {where}: "
            f"{' '.join(command)}"
        ) from None
    if proc.returncode != 0 or not times_file.exists():
        print(stdout[-4000:] + stderr[-4000:], file=sys.stderr)
        early = "" if proc.returncode else f" (its training ended before {steps} steps)"
        raise PointFailed(f"the point with {n} process(es) failed{early}: {' '.join(command)}")
    # The bench reads the clock, not the weights: each point's last checkpoint (the whole training state, 13 GB at
    # 1.1B parameters) would fill the disk over the points.
    shutil.rmtree(point_dir / "checkpoints", ignore_errors=True)
    return json.loads(times_file.read_text())


def phase(progress: Path, warmup: int, steps: int) -> str:
    """Where a point that ran past its limit was, from the steps its clock had counted."""
    done = int(progress.read_text() or 0) if progress.is_file() else 0
    if done == 0:
        return "before its first step ended (start-up, or the first step, where compile=true compiles)"
    if done < warmup:
        return f"in its warm-up steps ({done} of {warmup} done)"
    return f"in its timed steps ({done - warmup} of {steps - warmup} done)"


def dropped(override: str, preset: str, schedule: str | None) -> bool:
    """The user's strategy settings a point cannot take: none for single, not the schedule (nor its stages per
    process) while it is swept."""
    return (preset == "single" and override.startswith("strategy.")) or (
        schedule is not None and override.startswith(("strategy.schedule=", "strategy.stages_per_process="))
    )


def measure(
    times: dict[str, Any],
    n: int,
    batch: int,
    schedule: str | None,
    cfg: DictConfig,
    parameters: int,
    peak: float | None,
    tokens: int,
) -> dict[str, Any]:
    """One point's row from its step end times. `tokens`: positions each sample predicts (more than 1: a
    language model, which also gets tokens/s); `peak`: one device's FLOP/s (None: no MFU)."""
    warmup = cfg.bench.warmup_steps
    ends = times["step_ends"][warmup - 1 :]  # the end of the last warm-up step starts the clock
    seconds = (ends[-1] - ends[0]) / (len(ends) - 1)
    throughput = batch / seconds
    row: dict[str, Any] = {
        "devices": n,
        "schedule": schedule or "",
        "global_batch": batch,
        "step_ms": seconds * 1e3,
        "samples_per_s": throughput,
        "tokens_per_s": throughput * tokens if tokens > 1 else None,
        "mfu": 6 * parameters * tokens * throughput / (n * peak) if peak else None,
        "peak_memory_mib": times["peak_memory_mib"],
    }
    if schedule:
        idle = [sum(step) / len(step) for step in times["idle_fractions"][warmup:]]
        microbatches = cfg.strategy.microbatches
        row["measured_bubble"] = sum(idle) / len(idle) if idle else None
        per_process = check_stages_per_process(schedule, None)
        row["theoretical_bubble"] = bubble_fraction(positions(cfg, n), microbatches, schedule, per_process)
    return row


def peak_flops(cfg: DictConfig) -> float | None:
    """The peak FLOP/s of one device, for MFU: bench.peak_tflops, or the table for bf16 on known GPUs, when the
    training computes in bf16 (trainer.precision=auto does on them)."""
    if cfg.bench.peak_tflops:
        return cfg.bench.peak_tflops * 1e12
    on_gpu = cfg.trainer.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    if not on_gpu or resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator) != "bf16-mixed":
        return None
    return peak_bf16_flops(torch.cuda.get_device_name(0))


def peak_bf16_flops(name: str) -> float | None:
    """The table's peak for the GPU torch calls `name`, or None for one it does not know (give bench.peak_tflops)."""
    return next((tflops * 1e12 for gpu, tflops in PEAK_BF16_TFLOPS if gpu.lower() in name.lower()), None)


COLUMNS = [
    "devices", "schedule", "global_batch", "step_ms", "samples_per_s", "tokens_per_s", "linear_samples_per_s",
    "efficiency", "mfu", "peak_memory_mib", "measured_bubble", "theoretical_bubble",
]  # fmt: skip
MEMORY_COLUMNS = [
    "activation_checkpointing", "global_batch", "step_ms", "tokens_per_s", "samples_per_s", "mfu", "peak_memory_mib",
    "largest_batch",
]  # fmt: skip


def write_csv(rows: list[dict[str, Any]], path: Path, columns: list[str]) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, columns)
        writer.writeheader()
        writer.writerows({key: row.get(key) for key in columns} for row in rows)
    return path


def save(rows: list[dict[str, Any]], run_dir: Path, preset: str) -> tuple[Path, Path]:
    csv_path, png_path = write_csv(rows, run_dir / "scaling.csv", COLUMNS), run_dir / "scaling.png"
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.5), dpi=100)
    for schedule in dict.fromkeys(row["schedule"] for row in rows if row["devices"] > 1) or [""]:
        points = [row for row in rows if row["devices"] == 1 or row["schedule"] == schedule]
        label = f"{preset} {schedule}".strip()
        axes.plot([r["devices"] for r in points], [r["samples_per_s"] for r in points], "o-", label=label)
    axes.plot([r["devices"] for r in rows], [r["linear_samples_per_s"] for r in rows], "k--", label="linear")
    axes.set(xlabel="processes", ylabel="samples/s", title=f"Scaling of strategy={preset}")
    axes.set_xticks(sorted({r["devices"] for r in rows}))
    axes.set_ylim(bottom=0)
    axes.legend()
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
    return csv_path, png_path


def start_wandb(cfg: DictConfig, run_dir: Path, benchmark: str, preset: str) -> bool:
    """One wandb run for the benchmark's results (none with logger=none)."""
    if not cfg.logger:
        return False
    settings = {key: cfg.logger[key] for key in ("project", "entity", "group") if key in cfg.logger}
    wandb.init(
        **settings, job_type=f"bench-{benchmark}", dir=run_dir, mode=wandb_mode(),
        config={"bench": OmegaConf.to_container(cfg.bench), "strategy_preset": preset},
    )  # fmt: skip
    return True


def log_wandb(cfg: DictConfig, rows: list[dict[str, Any]], png: Path, run_dir: Path, preset: str) -> None:
    """One wandb run: the table, a line chart of throughput vs processes (with linear), and the plot."""
    if not start_wandb(cfg, run_dir, "scaling", preset):
        return
    table = wandb.Table(columns=COLUMNS, data=[[row.get(key) for key in COLUMNS] for row in rows])
    chart = wandb.plot.line_series(
        xs=[row["devices"] for row in rows],
        ys=[[row["samples_per_s"] for row in rows], [row["linear_samples_per_s"] for row in rows]],
        keys=["measured", "linear"], title=f"Scaling of strategy={preset}", xname="processes",
    )  # fmt: skip
    wandb.log({"scaling/table": table, "scaling/chart": chart, "scaling/plot": wandb.Image(str(png))})
    finish_wandb(False)


def log_memory(cfg: DictConfig, rows: list[dict[str, Any]], run_dir: Path, preset: str) -> None:
    if start_wandb(cfg, run_dir, "memory", preset):
        table = wandb.Table(columns=MEMORY_COLUMNS, data=[[row.get(key) for key in MEMORY_COLUMNS] for row in rows])
        wandb.log({"memory/table": table})
        finish_wandb(False)


def show(rows: list[dict[str, Any]], console: Console, title: str = "Scaling") -> None:
    """The results as a table; columns that no row has (MFU on a CPU, the bubble outside pipeline) are left out."""
    percent = "{:.0%}".format
    columns = {
        "activation checkpointing": ("activation_checkpointing", str),
        "processes": ("devices", str),
        "schedule": ("schedule", str),
        "global batch": ("global_batch", str),
        "step ms": ("step_ms", "{:.1f}".format),
        "samples/s": ("samples_per_s", "{:.0f}".format),
        "tokens/s": ("tokens_per_s", "{:.0f}".format),
        "linear": ("linear_samples_per_s", "{:.0f}".format),
        "efficiency": ("efficiency", percent),
        "MFU": ("mfu", "{:.1%}".format),
        "peak MiB": ("peak_memory_mib", "{:.0f}".format),
        "largest batch": ("largest_batch", str),
        "bubble measured": ("measured_bubble", percent),
        "bubble (p-1)/(m+p-1)": ("theoretical_bubble", percent),
    }
    shown = {name: c for name, c in columns.items() if any(row.get(c[0]) not in (None, "") for row in rows)}
    table = Table(*shown, title=title)
    for row in rows:
        table.add_row(*("-" if row.get(key) is None else fmt(row[key]) for key, fmt in shown.values()))
    console.print(table)


BENCHMARKS = ("scaling", "memory")
benchmark = "scaling"  # the one main() was asked for


@hydra.main(version_base="1.3", config_path="configs", config_name="bench")
def run(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    preset = HydraConfig.get().runtime.choices["strategy"]
    overrides = [
        o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(("bench.", "hydra.", *OWN_KEYS))
    ]
    console = Console()
    try:
        rows = (scaling if benchmark == "scaling" else memory)(cfg, overrides, run_dir, console)
    except ConfigError as err:
        fail(err, run_dir)
    except UNRESOLVED as err:  # e.g. data=files with a bad data.dir, a typo in a ${...}
        fail(unresolved(err), run_dir)
    except PointFailed as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    if benchmark == "memory":
        show(rows, console, "Activation checkpointing")
        csv_path = write_csv(rows, run_dir / "memory.csv", MEMORY_COLUMNS)
        log_memory(cfg, rows, run_dir, preset)
        print(f"bench: wrote {csv_path}")
        return
    show(rows, console)
    csv_path, png_path = save(rows, run_dir, preset)
    log_wandb(cfg, rows, png_path, run_dir, preset)
    print(f"bench: wrote {csv_path} and {png_path}")


def main() -> None:
    global benchmark
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(
            "usage: python -m {{ cookiecutter.package_name }}.bench scaling|memory [overrides]: the scaling of a preset "
            "over process counts, or the largest batch that fits (docs/doctor-and-bench.md)"
        )
        return
    if sys.argv[1:2] not in ([name] for name in BENCHMARKS):
        print(
            "error: usage: python -m {{ cookiecutter.package_name }}.bench scaling|memory [overrides]; valid "
            f"benchmarks: {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        sys.exit(2)
    benchmark = sys.argv.pop(1)  # the rest are Hydra overrides
    run_cli(run, "bench")


if __name__ == "__main__":
    main()
