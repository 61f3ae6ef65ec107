"""The template against a hand-written loop on one GPU: `python benchmarks/overhead.py --gpu [--size 350m]
[--float8 tensorwise]`, or this file directly with the same flags.

For each engine it bakes the default project and, interleaved --repeats times, runs the template's own benchmark on
the GPT (`python -m <package>.bench scaling model=gpt ... bench.devices=[1]`, bf16-mixed, compile=true: a real
training, its steps timed by the bench's clock) and benchmarks/gpu_loop.py (the raw loop) on the same model, batch and
tokens. It prints step time, tokens/s and MFU of each, and template / loop (target: at most 1.02). MFU = 6 x
parameters x tokens/s / the GPU's dense bf16 peak (--peak-tflops, 989 for an H100 SXM or H200): the dense-network
estimate, without attention's own FLOPs. --cpu: a tiny model on the CPU in fp32 without compile, to dry-run the
script (its figures mean nothing).
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "scaled_trainer"
SIZES = {  # parameters with the head tied to the embedding; and a CPU dry run's
    "350m": {"dim": 1024, "depth": 26, "heads": 8, "seq": 1024, "vocab": 32768, "batch": 16},  # 362M
    "470m": {"dim": 2048, "depth": 8, "heads": 16, "seq": 1024, "vocab": 32768, "batch": 32},  # 472M, wider
    "1b": {"dim": 3072, "depth": 9, "heads": 24, "seq": 1024, "vocab": 32768, "batch": 16},  # 1.12B
    "tiny": {"dim": 64, "depth": 2, "heads": 2, "seq": 32, "vocab": 64, "batch": 4},
}


def template_command(size: dict[str, int], args: argparse.Namespace, run_dir: Path) -> list[str]:
    net = f"model.net.dim={size['dim']} model.net.depth={size['depth']} model.net.num_heads={size['heads']}"
    data = f"data.seq_len={size['seq']} data.vocab_size={size['vocab']} data.batch_size={size['batch']}"
    device = (
        "trainer.accelerator=cpu trainer.precision=32-true compile=false"
        if args.cpu
        else "trainer.accelerator=gpu trainer.precision=bf16-mixed compile=true"
    )
    bench = f"bench.devices=[1] bench.warmup_steps={args.warmup} bench.steps={args.steps} bench.timeout_s={args.limit}"
    return [
        *(sys.executable, "-m", f"{PACKAGE}.bench", "scaling", "model=gpt", *net.split(), *data.split()),
        *device.split(), *bench.split(), f"bench.peak_tflops={args.peak_tflops}", f"float8={args.float8}",
        "logger=none", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip


def loop_command(size: dict[str, int], args: argparse.Namespace) -> list[str]:
    flags = [f"--{name}={value}" for name, value in size.items()]
    flags += [f"--warmup={args.warmup}", f"--steps={args.steps}", f"--peak-tflops={args.peak_tflops}"]
    flags += [f"--float8={args.float8}"] + (["--cpu", "--no-compile"] if args.cpu else [])
    return [sys.executable, str(HERE / "gpu_loop.py"), PACKAGE, *flags]


def run(command: list[str], project: Path, env: dict[str, str], log: Path, limit: int) -> str:
    try:  # the bench stops its own point at the limit, saying in which phase; this is for the loop
        proc = subprocess.run(
            command, cwd=project, env=env, capture_output=True, text=True, timeout=limit + 60, check=False
        )
    except subprocess.TimeoutExpired as stopped:
        log.write_text(f"{stopped.stdout or ''}{stopped.stderr or ''}")
        sys.exit(f"benchmark run past {limit + 60} s ({log}): {' '.join(command)}")
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"benchmark run failed ({log}): {' '.join(command)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def template_run(
    size: dict[str, int], args: argparse.Namespace, project: Path, env: dict, workdir: Path, logs: Path
) -> dict:
    run_dir = workdir / f"bench-{len(list(workdir.glob('bench-*')))}"
    run(template_command(size, args, run_dir), project, env, logs / f"{run_dir.name}.log", args.limit)
    with (run_dir / "scaling.csv").open() as file:
        (row,) = csv.DictReader(file)
    return {key: float(row[key]) for key in ("step_ms", "tokens_per_s", "mfu")}


def loop_run(size: dict[str, int], args: argparse.Namespace, project: Path, env: dict, logs: Path) -> dict:
    log = logs / f"loop-{len(list(logs.glob('loop-*')))}.log"
    return json.loads(run(loop_command(size, args), project, env, log, args.limit).strip().splitlines()[-1])


def compare(engines: list[str], args: argparse.Namespace, bake) -> None:
    size = SIZES[args.size]
    print(f"GPT {args.size} {size}, float8={args.float8}, {args.repeats} repeat(s), peak {args.peak_tflops} TFLOP/s")
    print(f"{'engine':10} {'variant':9} {'step ms':>8} {'tokens/s':>10} {'MFU':>6} {'template/loop':>14}")
    for engine in engines:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            project = bake(engine, workdir)
            # each run's output: kept under --logs (a folder per engine), or in the temp folder
            logs = args.logs / engine if args.logs else workdir
            logs.mkdir(parents=True, exist_ok=True)
            paths = [str(project / "src"), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), WANDB_MODE="offline")
            env.update(WANDB_DIR=tmp, WANDB_SILENT="true")
            runs: dict[str, list[dict]] = {"template": [], "loop": []}
            for _ in range(args.repeats):  # interleaved: whatever else the GPU does hits both alike
                runs["template"].append(template_run(size, args, project, env, workdir, logs))
                runs["loop"].append(loop_run(size, args, project, env, logs))
            ratio = statistics.median(t["step_ms"] / p["step_ms"] for t, p in zip(*runs.values(), strict=True))
            for name, results in runs.items():
                step, tokens, mfu = (
                    statistics.median(r[key] for r in results) for key in ("step_ms", "tokens_per_s", "mfu")
                )
                shown = f"{ratio:14.3f}" if name == "template" else f"{'':14}"
                print(f"{engine:10} {name:9} {step:8.2f} {tokens:10.0f} {mfu:6.1%} {shown}", flush=True)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=list(SIZES), default="350m")
    parser.add_argument("--float8", default="none", help="tensorwise | rowwise: both variants convert the same layers")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="a dry run of the script on the CPU")
    parser.add_argument("--limit", type=int, default=900, help="seconds one run may take")
    parser.add_argument("--logs", type=Path, help="a folder to keep each run's output in")


def baked(folder: Path):
    """A bake function that returns the project baked beforehand into folder/<engine>/ (a GPU machine without
    cookiecutter)."""
    return lambda engine, workdir: folder.resolve() / engine / "scaled-trainer"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["lightning", "accelerate", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baked", type=Path, help="projects baked beforehand, as <folder>/<engine>/scaled-trainer")
    arguments(parser)
    options = parser.parse_args()
    if options.baked:
        bake = baked(options.baked)
    else:
        from overhead import bake
    compare(["lightning", "accelerate"] if options.engine == "both" else [options.engine], options, bake)
