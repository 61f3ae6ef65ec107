"""Python function calls per training step: an overhead measure that other jobs on the machine do not move.

    python benchmarks/calls.py                    # both engines, one process, small steps
    python benchmarks/calls.py --ddp --top 25     # 2 processes (rank 0's calls); the 25 functions adding most

Runs overhead.py's variants with cProfile on over --steps whole training iterations (from batch start to batch
start, after 20 warm-up steps; benchmarks/step_timer.py switches it on and off), so start-up and the epoch's end
are left out. cProfile counts the calls of the main thread, Python functions and built-in ones alike. Prints
calls per step per variant, and where the template's extra calls are: the functions whose calls per step differ
most from the baseline's (plain Lightning for the Lightning engine, the plain loop for the Accelerate engine).
Keep --steps a multiple of 20: the progress bar redraws and the loggers write every 20 and 10 steps.
"""

import argparse
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import PACKAGE, SETTINGS, bake, environment, variants

WARM_UP = 20


def calls_per_function(profile: Path) -> dict[str, int]:
    stats = pstats.Stats(str(profile)).stats  # (file, line, name) -> (primitive calls, calls, ...)
    per_function: dict[str, int] = {}
    for (file, line, name), (_, calls, *_) in stats.items():
        key = f"{name} ({Path(file).name}:{line})" if line else re.sub(r" at 0x[0-9a-f]+", "", name)
        per_function[key] = per_function.get(key, 0) + calls
    return per_function


def per_step(engine: str, setting: str, ddp: bool, steps: int, workdir: Path) -> dict[str, dict[str, float]]:
    """variant -> function -> calls per step."""
    project = workdir / engine / "scaled-trainer"
    total = WARM_UP + steps + 1
    results = {}
    for name, (launcher, target) in variants(engine, setting, ddp, 1, total * SETTINGS[setting][2], total).items():
        if name == "template A/A":  # call counts do not vary between identical runs: no noise to measure
            continue
        out = workdir / f"{engine}-{name}.prof"
        env = dict(environment(project, str(workdir)), BENCH_PROFILE=f"{out}:{WARM_UP}:{steps}")
        env.update(BENCH_OUT=str(out.with_suffix(".json")), BENCH_LAUNCH=repr(time.time()))
        command = [*launcher, *target]
        if f"{PACKAGE}.train" in target:  # a fresh run folder: one with a checkpoint in it would resume
            command.append(f"hydra.run.dir={out.with_suffix('')}")
        proc = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not out.exists():
            sys.exit(f"profiled run failed: {' '.join(command)}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        results[name] = {function: calls / steps for function, calls in calls_per_function(out).items()}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["lightning", "accelerate", "both"], default="both")
    parser.add_argument("--setting", choices=list(SETTINGS), default="small-step")
    parser.add_argument("--ddp", action="store_true", help="2 gloo processes instead of one")
    parser.add_argument("--steps", type=int, default=200, help="training iterations profiled")
    parser.add_argument("--top", type=int, default=15, help="functions listed per engine")
    args = parser.parse_args()
    engines = ["lightning", "accelerate"] if args.engine == "both" else [args.engine]
    layout = "ddp x2" if args.ddp else "single"
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for engine in engines:
            bake(engine, workdir / engine)
            results = per_step(engine, args.setting, args.ddp, args.steps, workdir)
            base = "lightning" if engine == "lightning" else "plain"
            print(f"\n{engine} engine, {layout}, {args.setting}: Python calls per step (main thread, rank 0)")
            for name, functions in results.items():
                total = sum(functions.values())
                extra = total - sum(results[base].values())
                print(f"  {name:12} {total:8.0f}" + (f"  ({extra:+.0f} vs {base})" if name != base else ""))
            template, baseline = results["template"], results[base]
            difference = {f: template.get(f, 0) - baseline.get(f, 0) for f in template.keys() | baseline.keys()}
            print(f"  the {args.top} functions whose calls per step differ most from {base}'s (template - {base}):")
            for function, extra in sorted(difference.items(), key=lambda item: -abs(item[1]))[: args.top]:
                print(f"    {extra:+7.1f}  {function}")


if __name__ == "__main__":
    main()
