"""What the template costs at run time, against a hand-written PyTorch loop.

    python benchmarks/overhead.py           # single process: default settings and a small-step setting
    python benchmarks/overhead.py --ddp     # adds strategy=ddp (2 gloo processes) vs a plain DDP loop
    python benchmarks/overhead.py --engine accelerate   # one engine only (default: both, one after the other)
    python benchmarks/overhead.py --smoke   # a few steps only: checks that it runs and prints ratios (CI)

It bakes the project, then runs each variant as its own process, interleaved, --repeats times: the
template's default training (Lightning: default callbacks, wandb offline, progress bar; Accelerate: wandb
offline, checkpoints every epoch), plain Lightning (same LightningModule, no logger, callbacks or
progress bar; Lightning engine only) and plain PyTorch (benchmarks/plain_loop.py). Multi-process
Accelerate runs start with torchrun, like the plain DDP loop. Step time is the median time between consecutive batch starts,
after the first epoch (warm-up) and never across an epoch end (validation). Start-up is the
time from launching the command to the first batch. Ratios compare runs of the same repeat.
It ends with the targets' table: per engine, layout and setting, template / plain loop and (Lightning)
template / plain Lightning (targets: Accelerate <= 1.05x the loop; Lightning template <= 1.02x plain Lightning).
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

from cookiecutter.main import cookiecutter

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE.parent
PACKAGE = "scaled_trainer"

# name: (template overrides, plain-loop args (hidden, depth), global batch)
SETTINGS = {
    "default": ([], (128, 4), 256),
    "small-step": (["model.net.hidden=32", "model.net.depth=1", "data.batch_size=32"], (32, 1), 32),
}
PLAIN_LIGHTNING = [
    "logger=none",
    "callbacks=none",
    "trainer.enable_progress_bar=false",
    "trainer.enable_checkpointing=false",
]
DDP = ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]


def run(command: list[str], project: Path, workdir: Path, env: dict[str, str]) -> dict:
    run_id = time.monotonic_ns()
    out = workdir / f"timing-{run_id}.json"
    if f"{PACKAGE}.train" in command:  # a fresh run folder: one with a checkpoint in it would resume
        command = [*command, f"hydra.run.dir={workdir}/run-{run_id}"]
    env = dict(env, BENCH_OUT=str(out), BENCH_LAUNCH=repr(time.time()))
    proc = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"benchmark run failed: {' '.join(command)}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    timing = json.loads(out.read_text())
    steps = [
        later - earlier
        for earlier, later, epoch, next_epoch in zip(
            timing["starts"], timing["starts"][1:], timing["epochs"], timing["epochs"][1:], strict=False
        )
        if epoch == next_epoch and epoch >= 1
    ]
    return {
        "step_ms": 1000 * statistics.median(steps),
        "startup_s": timing["starts"][0] - timing["launch"],
        "rss_mb": timing["max_rss_mb"],
    }


def variants(engine: str, setting: str, epochs: int, train_size: int, ddp: bool, workdir: Path) -> dict[str, list[str]]:
    overrides, (hidden, depth), batch = SETTINGS[setting]
    timer = (
        "+callbacks.step_timer._target_=step_timer.StepTimer"
        if engine == "lightning"
        else "model.net._target_=step_timer.timed_net"  # the Accelerate loop has no callbacks
    )
    common = [
        *overrides,
        f"trainer.max_epochs={epochs}",
        f"data.train_size={train_size}",
        "test_after_fit=false",
        timer,
        *(DDP if ddp else []),
    ]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    # Lightning starts its ddp processes itself; the Accelerate engine's come from a launcher.
    train = [*(launcher if ddp and engine == "accelerate" else [sys.executable]), "-m", f"{PACKAGE}.train"]
    plain = [str(HERE / "plain_loop.py"), PACKAGE, str(epochs), str(batch), str(hidden), str(depth)]
    commands = {"template": [*train, *common]}
    if engine == "lightning":
        commands["lightning"] = [*train, *common, *PLAIN_LIGHTNING]
    commands["plain"] = [*(launcher if ddp else [sys.executable]), *plain]
    return commands


def ratio(results: dict[str, list[dict]], name: str, base: str) -> float:
    """Median over repeats of name's step time / base's step time in the same repeat."""
    pairs = zip(results[name], results[base], strict=True)
    return statistics.median(r["step_ms"] / b["step_ms"] for r, b in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ddp", action="store_true", help="also benchmark strategy=ddp on 2 CPU processes")
    parser.add_argument("--engine", choices=["lightning", "accelerate", "both"], default="both")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI: checks that it works")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    repeats, epochs, train_size = (1, 2, 2048) if args.smoke else (args.repeats, args.epochs, 8192)
    engines = ["lightning", "accelerate"] if args.engine == "both" else [args.engine]
    layouts = [("single", False)] + ([("ddp x2", True)] if args.ddp else [])
    targets = []  # (engine, layout, setting, template/plain loop, template/plain Lightning)

    print(
        f"{'engine':10} {'layout':8} {'setting':11} {'variant':10} {'step ms':>8} {'/plain':>7} {'start-up s':>10} "
        f"{'peak RSS MB':>11}"
    )
    for engine in engines:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            project = Path(
                cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(workdir), extra_context={"engine": engine})
            )
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(project / "src"), str(HERE)]), BENCH_PACKAGE=PACKAGE)
            env.update(
                WANDB_MODE="offline", WANDB_DIR=tmp, WANDB_CACHE_DIR=tmp, WANDB_CONFIG_DIR=tmp, WANDB_SILENT="true"
            )
            for layout, ddp in layouts:
                for setting in SETTINGS:
                    commands = variants(engine, setting, epochs, train_size, ddp, workdir)
                    results = {name: [] for name in commands}
                    for _ in range(repeats):  # interleaved, so load on the machine hits every variant alike
                        for name, command in commands.items():
                            results[name].append(run(command, project, workdir, env))

                    for name, runs in results.items():
                        step, startup, rss = (statistics.median(r[key] for r in runs) for key in runs[0])
                        print(
                            f"{engine:10} {layout:8} {setting:11} {name:10} {step:8.2f} {ratio(results, name, 'plain'):7.3f} "
                            f"{startup:10.2f} {rss:11.0f}"
                        )
                    over_lightning = ratio(results, "template", "lightning") if "lightning" in results else None
                    targets.append((engine, layout, setting, ratio(results, "template", "plain"), over_lightning))

    print("\ntargets: Accelerate template <= 1.05 x plain loop; Lightning template <= 1.02 x plain Lightning")
    print(f"{'engine':10} {'layout':8} {'setting':11} {'template/plain loop':>20} {'template/plain Lightning':>25}")
    for engine, layout, setting, over_loop, over_lightning in targets:
        lightning = f"{over_lightning:25.3f}" if over_lightning is not None else f"{'-':>25}"
        print(f"{engine:10} {layout:8} {setting:11} {over_loop:20.3f} {lightning}")


if __name__ == "__main__":
    main()
