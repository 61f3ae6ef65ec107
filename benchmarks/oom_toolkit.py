"""Benchmark the OOM toolkit of the generated project. CPU is enough (a GPU makes host syncs costlier).

    python benchmarks/oom_toolkit.py        # from the template root; bakes the template into a temp dir

1. Batch-size finder: trials and seconds under `single` and `ddp` (2 gloo processes), against a simulated
   memory limit (the generated tests' OOMClassifier raises torch.OutOfMemoryError above N samples per device).
2. `.item()` logger: median step time of one training with Lightning's own logging, with and without the
   ItemMetricLogger (same seed, same data), alternated to even out a busy machine.
"""

import itertools
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

import lightning as L
import torch
from cookiecutter.main import cookiecutter
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.profilers import SimpleProfiler

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 300  # simulated: more than this many samples per device "does not fit"


def bake(output_dir: Path) -> Path:
    return Path(cookiecutter(str(ROOT), no_input=True, output_dir=str(output_dir)))


def finder_cost(project: Path, package: str, layout: list[str], run_dir: Path) -> str:
    env = dict(os.environ, PYTHONPATH=f"{project / 'src'}{os.pathsep}{project / 'tests'}", WANDB_MODE="disabled")
    command = [
        *(sys.executable, "-m", f"{package}.train", f"hydra.run.dir={run_dir}"),
        *("oom.find_batch_size=true", "~callbacks.progress_bar", "logger=none"),
        *("trainer.accelerator=cpu", "trainer.max_steps=1", "trainer.limit_val_batches=0", "test_after_fit=false"),
        *("trainer.enable_progress_bar=false", "+model._target_=oom_sim.OOMClassifier", f"+model.oom_above={LIMIT}"),
        *layout,
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, check=False, env=env, capture_output=True, text=True, cwd=project, timeout=600)
    total = time.perf_counter() - start
    found = re.search(r"BatchSizeFinder: .*", proc.stdout + proc.stderr)
    if proc.returncode or not found:
        return f"failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}"
    return f"{found.group(0)}  [whole run {total:.1f}s]"


def step_times(project: Path, with_item_logger: bool, steps: int = 100) -> tuple[float, float]:
    """(median seconds per training step after 10 warm-up steps, mean seconds per call of the logger's hook)."""
    sys.path.insert(0, str(project / "src"))
    package = project.name.replace("-", "_")
    data = __import__(f"{package}.engine.datamodule", fromlist=["x"])
    synthetic = __import__(f"{package}.data.synthetic", fromlist=["x"])
    model = __import__(f"{package}.models.mlp", fromlist=["x"])
    module = __import__(f"{package}.engine.module", fromlist=["x"])
    item_logger = __import__(f"{package}.engine.callbacks.item_logger", fromlist=["x"])

    stamps: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, *args) -> None:
            stamps.append(time.perf_counter())

    callbacks = [Clock()] + ([item_logger.ItemMetricLogger()] if with_item_logger else [])
    profiler = SimpleProfiler()  # times every callback hook: the logger's own cost, whatever the machine's load
    L.seed_everything(0, verbose=False)
    with tempfile.TemporaryDirectory() as logs:
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=steps,
            log_every_n_steps=10,
            logger=CSVLogger(logs),
            callbacks=callbacks,
            profiler=profiler,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        net = model.ResidualMLP(32, 8)
        classifier = module.Classifier(net, optimizer=partial(torch.optim.AdamW, lr=1e-3))
        trainer.fit(
            classifier,
            datamodule=data.DataModule(**synthetic.data_settings(batch_size=256, train_size=256 * (steps + 1))),
        )
    hook = [
        t for key, ts in profiler.recorded_durations.items() if "ItemMetricLogger.on_train_batch_end" in key for t in ts
    ]
    return statistics.median(b - a for a, b in itertools.pairwise(stamps[10:])), statistics.mean(hook or [0.0])


def main() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # keep the report readable
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        project = bake(Path(tmp))
        package = project.name.replace("-", "_")
        print(f"baked {project.name}; simulated limit {LIMIT} samples per device; {os.cpu_count()} CPUs")
        print("\n1. Batch-size finder (start 256 global, margin 10%, 2 optimizer steps per trial)")
        layouts = {"single": ["strategy=single"], "ddp x2": ["strategy=ddp", "trainer.devices=2"]}
        for index, (name, layout) in enumerate(layouts.items()):
            print(f"  {name:7s} {finder_cost(project, package, layout, Path(tmp) / f'run{index}')}")
        print("\n2. Step time, Lightning's logging vs + ItemMetricLogger (median ms/step, 3 alternating rounds)")
        torch.set_num_threads(1)  # one thread: less at the mercy of other processes on a busy machine
        results: dict[bool, list[float]] = {False: [], True: []}
        hook_seconds = []
        for _ in range(3):
            for with_item_logger in (False, True):
                step, hook = step_times(project, with_item_logger)
                results[with_item_logger].append(step)
                hook_seconds += [hook] if with_item_logger else []
        for with_item_logger, times in results.items():
            label = "+ ItemMetricLogger" if with_item_logger else "Lightning logging "
            rounds = " ".join(f"{t * 1e3:6.2f}" for t in times)
            print(f"  {label}  {rounds}  median {statistics.median(times) * 1e3:.2f}")
        base, item = (statistics.median(results[flag]) for flag in (False, True))
        print(f"  difference of medians: {(item - base) * 1e3:+.2f} ms/step ({(item / base - 1) * 100:+.1f}%)")
        hook = statistics.mean(hook_seconds)
        print(
            f"  ItemMetricLogger hook, timed by Lightning's profiler: {hook * 1e6:.0f} us/step ({hook / base:.2%} of a step)"
        )


if __name__ == "__main__":
    main()
