"""What the template costs at run time, against a hand-written PyTorch loop.

    python benchmarks/overhead.py           # single process: default settings and a small-step setting
    python benchmarks/overhead.py --ddp     # adds strategy=ddp (2 gloo processes) vs a plain DDP loop
    python benchmarks/overhead.py --engine accelerate   # one engine only (default: both, one after the other)
    python benchmarks/overhead.py --smoke   # a few steps, no A/A pair: checks that it runs and prints ratios (CI)
    python benchmarks/overhead.py --gpu [--size 350m|1b] [--float8 tensorwise]   # the GPT on one GPU: gpu_overhead.py

It bakes the project, then runs each variant as its own process, interleaved, --repeats times: the
template's default training (Lightning: default callbacks, wandb offline, progress bar; Accelerate: wandb
offline, checkpoints every epoch), the same again (the A/A pair: how far two identical runs land apart, the
noise of one cell), plain Lightning (benchmarks/plain_lightning.py: the smallest LightningModule over the same
net, data and optimisation; Lightning engine only) and plain PyTorch (benchmarks/plain_loop.py, the same
optimisation: grouped AdamW, warmup + cosine schedule). Multi-process Accelerate runs and the plain DDP loop
start with torchrun. Step time is the median time between consecutive batch starts, after the first epoch
(warm-up) and never across an epoch end (validation); CPU time per step (all the process's threads) is the
mean, and moves much less than wall time when other jobs share the machine. Start-up is the time from launching
the command to the first batch. Ratios compare runs of the same repeat. It ends with the targets' table: per
engine, layout and setting, template / plain loop, (Lightning) template / plain Lightning and the A/A ratio, each
as wall time / CPU time (targets: Accelerate <= 1.05x the loop; Lightning template <= 1.02x plain Lightning).
benchmarks/calls.py counts Python calls per step instead, which no other job moves.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpu_overhead
from cookiecutter.main import cookiecutter

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE.parent
PACKAGE = "scaled_trainer"

# name: (template overrides, plain-loop args (hidden, depth), global batch)
SETTINGS = {
    "default": ([], (128, 4), 256),
    "small-step": (["model.net.hidden=32", "model.net.depth=1", "data.batch_size=32"], (32, 1), 32),
}
DDP = ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def run(command: list[str], project: Path, workdir: Path, env: dict[str, str]) -> dict:
    """Run one variant to its end; its step times after the first epoch (warm-up), never across an epoch's end."""
    run_id = time.monotonic_ns()
    out = workdir / f"timing-{run_id}.json"
    if f"{PACKAGE}.train" in command:  # a fresh run folder: one with a checkpoint in it would resume
        command = [*command, f"hydra.run.dir={workdir}/run-{run_id}"]
    env = dict(env, BENCH_OUT=str(out), BENCH_LAUNCH=repr(time.time()))
    proc = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"benchmark run failed: {' '.join(command)}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    timing = json.loads(out.read_text())
    steady = [
        (later - earlier, cpu_later - cpu_earlier)
        for earlier, later, cpu_earlier, cpu_later, epoch, next_epoch in zip(
            timing["starts"],
            timing["starts"][1:],
            timing["cpu"],
            timing["cpu"][1:],
            timing["epochs"],
            timing["epochs"][1:],
            strict=False,
        )
        if epoch == next_epoch and epoch >= 1
    ]
    return {
        "step_ms": 1000 * statistics.median(wall for wall, _ in steady),
        # The mean, not the median: what runs every N steps (logging) counts; CPU time is little moved by load.
        "cpu_ms": 1000 * statistics.mean(cpu for _, cpu in steady),
        "startup_s": timing["starts"][0] - timing["launch"],
        "rss_mb": timing["max_rss_mb"],
    }


def variants(
    engine: str, setting: str, ddp: bool, epochs: int, train_size: int, steps: int = -1
) -> dict[str, tuple[list[str], list[str]]]:
    """name: (launcher, what it runs) for each variant: the template, the template again (the A/A pair: how far
    two identical runs land apart), plain Lightning (Lightning engine) and the plain loop. `steps` > 0: stop
    after that many optimizer steps (the first epoch must hold them)."""
    overrides, (hidden, depth), batch = SETTINGS[setting]
    timer = (
        "+callbacks.step_timer._target_=step_timer.StepTimer"
        if engine == "lightning"
        else "model.net._target_=step_timer.timed_net"  # the Accelerate loop has no callbacks
    )
    common = [
        *overrides,
        f"trainer.max_epochs={epochs}",
        f"trainer.max_steps={steps}",
        f"data.train_size={train_size}",
        "test_after_fit=false",
        timer,
        *(DDP if ddp else []),
    ]
    # Lightning starts its ddp processes itself; the Accelerate engine's and the plain loop's come from torchrun.
    python = [sys.executable]
    train = (TORCHRUN if ddp and engine == "accelerate" else python, ["-m", f"{PACKAGE}.train", *common])
    plain = [PACKAGE, f"--epochs={epochs}", f"--steps={steps}", f"--batch={batch}", f"--hidden={hidden}"]
    plain += [f"--depth={depth}", f"--train-size={train_size}"]
    commands = {"template": train, "template A/A": train}
    if engine == "lightning":
        commands["lightning"] = (python, [str(HERE / "plain_lightning.py"), *plain, f"--devices={2 if ddp else 1}"])
    commands["plain"] = (TORCHRUN if ddp else python, [str(HERE / "plain_loop.py"), *plain])
    return commands


def ratio(results: dict[str, list[dict]], name: str, base: str, key: str = "step_ms") -> float:
    """Median over repeats of name's `key` / base's in the same repeat."""
    pairs = zip(results[name], results[base], strict=True)
    return statistics.median(r[key] / b[key] for r, b in pairs)


def environment(project: Path, tmp: str) -> dict[str, str]:
    """Every variant alike: the baked package and benchmarks/ importable, wandb offline, one intra-op thread (on a
    shared machine extra threads spin against other jobs, which moves step times by several times)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(project / "src"), str(HERE)]), BENCH_PACKAGE=PACKAGE)
    env.update(WANDB_MODE="offline", WANDB_DIR=tmp, WANDB_CACHE_DIR=tmp, WANDB_CONFIG_DIR=tmp, WANDB_SILENT="true")
    env.update(OMP_NUM_THREADS="1")
    return env


def bake(engine: str, workdir: Path) -> Path:
    return Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(workdir), extra_context={"engine": engine}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ddp", action="store_true", help="also benchmark strategy=ddp on 2 CPU processes")
    parser.add_argument("--engine", choices=["lightning", "accelerate", "both"], default="both")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny run for CI, small steps, no A/A pair: checks that it works"
    )
    parser.add_argument("--repeats", type=int, default=None, help="default: 3 (CPU), 1 (--gpu)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="the GPT on one GPU against gpu_loop.py (gpu_overhead.py)")
    gpu_overhead.arguments(parser)
    args = parser.parse_args()
    if args.gpu:
        engines = ["lightning", "accelerate"] if args.engine == "both" else [args.engine]
        args.repeats = args.repeats or 1  # GPU time is scarce: one run of each variant unless asked for more
        gpu_overhead.compare(engines, args, bake)
        return
    repeats, epochs, train_size = (1, 2, 1024) if args.smoke else (args.repeats or 3, args.epochs, 8192)
    settings = ["small-step"] if args.smoke else list(SETTINGS)
    engines = ["lightning", "accelerate"] if args.engine == "both" else [args.engine]
    layouts = [("single", False)] + ([("ddp x2", True)] if args.ddp else [])
    targets = []  # (engine, layout, setting, {ratio name: (by wall time, by CPU time)})

    print(
        f"{'engine':10} {'layout':8} {'setting':11} {'variant':12} {'step ms':>8} {'/plain':>7} {'CPU ms':>7} "
        f"{'/plain':>7} {'start-up s':>10} {'peak RSS MB':>11}"
    )
    for engine in engines:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            project = bake(engine, workdir)
            env = environment(project, tmp)
            for layout, ddp in layouts:
                for setting in settings:
                    commands = variants(engine, setting, ddp, epochs, train_size)
                    if args.smoke:  # it checks that each variant runs; the A/A pair is the template's command again
                        del commands["template A/A"]
                    results = {name: [] for name in commands}
                    for _ in range(repeats):  # interleaved, so load on the machine hits every variant alike
                        for name, (launcher, target) in commands.items():
                            results[name].append(run([*launcher, *target], project, workdir, env))

                    for name, runs in results.items():
                        step, cpu, startup, rss = (statistics.median(r[key] for r in runs) for key in runs[0])
                        print(
                            f"{engine:10} {layout:8} {setting:11} {name:12} {step:8.2f} "
                            f"{ratio(results, name, 'plain'):7.3f} {cpu:7.2f} {ratio(results, name, 'plain', 'cpu_ms'):7.3f} "
                            f"{startup:10.2f} {rss:11.0f}"
                        )
                    pairs = {"loop": ("template", "plain")}
                    if "template A/A" in results:
                        pairs["A/A"] = ("template A/A", "template")
                    if "lightning" in results:
                        pairs["Lightning"] = ("template", "lightning")
                    targets.append(
                        (
                            engine,
                            layout,
                            setting,
                            {
                                label: (ratio(results, *pair), ratio(results, *pair, "cpu_ms"))
                                for label, pair in pairs.items()
                            },
                        )
                    )

    print(
        "\ntargets: Accelerate template <= 1.05 x plain loop; Lightning template <= 1.02 x plain Lightning"
        "\n(step time ratio / CPU time ratio; A/A: the template against itself, the noise of one cell)"
    )
    print(f"{'engine':10} {'layout':8} {'setting':11} {'template/loop':>15} {'template/Lightning':>19} {'A/A':>13}")
    for engine, layout, setting, ratios in targets:
        cells = [
            f"{ratios[label][0]:.3f}/{ratios[label][1]:.3f}" if label in ratios else "-"
            for label in ("loop", "Lightning", "A/A")
        ]
        print(f"{engine:10} {layout:8} {setting:11} {cells[0]:>15} {cells[1]:>19} {cells[2]:>13}")


if __name__ == "__main__":
    main()
