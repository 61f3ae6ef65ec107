"""`python -m {{ cookiecutter.package_name }}.bench scaling`: real trainings at 1 and 2 gloo processes on the CPU."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_nvml import FakeGPU, FakeNVML
from forked import run_module
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from wandb_records import offline_runs

from {{ cookiecutter.package_name }}.bench import (
    check_one_epoch,
    left_out,
    main,
    memory,
    model_figures,
    peak_bf16_flops,
    peak_flops,
    phase,
    pipeline_schedules,
    scaling,
)
from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.config.objects import register_resolvers
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.runtime import hardware
from {{ cookiecutter.package_name }}.tools.estimate import count_parameters, training_split

PACKAGE = "{{ cookiecutter.package_name }}"
PROJECT = Path(__file__).resolve().parent.parent  # the launchers' configs (launch/) are relative to it
QUICK = ["trainer.accelerator=cpu", "bench.warmup_steps=2", "bench.steps=3"]
TINY = ["model.net.hidden=32", "model.net.depth=2", "data.batch_size=32"]
TINY_GPT = ["model=gpt", "model.net.dim=16", "model.net.depth=1", "model.net.num_heads=2", "data.seq_len=16"]


def bench(tmp_path: Path, env: dict[str, str], *overrides: str) -> tuple[Path, list[dict[str, str]]]:
    run_dir = tmp_path / "bench"
    args = ["scaling", f"hydra.run.dir={run_dir}", *QUICK, *overrides]
    proc = run_module(f"{PACKAGE}.bench", args, env, PROJECT, 600, preload=f"{PACKAGE}.train")  # CI time: forked
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"bench: wrote {run_dir / 'scaling.csv'} and {run_dir / 'scaling.png'}" in proc.stdout
    with (run_dir / "scaling.csv").open() as file:
        return run_dir, list(csv.DictReader(file))


def config(name: str, *overrides: str):
    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def test_the_model_is_sized_on_the_datas_samples():
    """Images and a convolutional net: the bench's forward on meta takes a batch shaped as the data's first sample
    (read on the CPU: under the meta device it was a batch of data.num_features values, a conv2d traceback)."""
    images = ["data=custom", "data.dataset._target_=custom_dataset.Images", "data.num_features=192"]
    cfg = config("bench", *images, "data.num_classes=4", "model.net._target_=own_models.SmallCNN")
    net, parameters, tokens, _ = model_figures(cfg)
    assert tokens == 1 and parameters == count_parameters(net) > 0


def test_points_whose_timed_steps_reach_the_epochs_end_are_refused():
    """A dataset of yours has its own length (the template's are sized for the steps): 16 images make 2 steps of a
    global batch of 8, fewer than the 2 + 2 a point runs, so the epoch's end (validation, a checkpoint) would have
    been timed as a step (a helper's 2-process point read 96 ms where its steps took 52)."""
    images = ["data=custom", "data.dataset._target_=custom_dataset.Images", "data.num_features=192"]
    cfg = config("bench", *images, "data.num_classes=4", "bench.warmup_steps=2", "bench.steps=2")
    split = training_split(cfg)
    check_one_epoch(cfg, {1: 4}, split)  # 4 steps of 4: the last timed step ends the epoch, nothing after it is timed
    with pytest.raises(ConfigError, match="with 2 process.es. the global batch is 8, and the training split's 16 "
                       "samples make 2 steps of it, fewer than the 4 run"):  # fmt: skip
        check_one_epoch(cfg, {1: 4, 2: 8}, split)


@pytest.mark.slow  # each point is a training
def test_ddp_weak_scaling(tmp_path, train_env):
    run_dir, rows = bench(tmp_path, train_env, *TINY, "strategy=ddp", "bench.devices=[1,2]")

    assert [int(row["devices"]) for row in rows] == [1, 2]
    assert [int(row["global_batch"]) for row in rows] == [32, 64]  # weak scaling: 32 samples per process
    one, two = (float(row["samples_per_s"]) for row in rows)
    for row in rows:
        assert float(row["samples_per_s"]) == pytest.approx(int(row["global_batch"]) / (float(row["step_ms"]) / 1e3))
        assert float(row["efficiency"]) == pytest.approx(
            float(row["samples_per_s"]) / float(row["linear_samples_per_s"])
        )
        assert row["tokens_per_s"] == ""  # a classifier's samples are not token sequences
    assert float(rows[1]["linear_samples_per_s"]) == pytest.approx(2 * one)

    # Each point was the real training: 2 processes, the grown batch, and one clock tick per optimizer step.
    point = OmegaConf.load(run_dir / "points" / "2" / "config.yaml")
    assert point.data.batch_size == 64
    assert not list(run_dir.glob("points/*/checkpoints")), "the points' checkpoints are deleted"
    assert len(json.loads((run_dir / "points" / "2.json").read_text())["step_ends"]) == 2 + 3

    png = (run_dir / "scaling.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 100_000
    (run,) = offline_runs(run_dir)
    logged = next(row for row in run.history if "scaling/table/nrows" in row)
    assert logged["scaling/table/nrows"] == 2 and logged["scaling/plot/_type"] == "image-file"
    assert logged["scaling/chart_table/nrows"] == 2 * 2  # the chart's data: measured and linear, at 1 and 2
    assert run.config["strategy_preset"] == "ddp"


@pytest.mark.slow
def test_ddp_spawn_and_tokens_per_second(tmp_path, train_env):
    """ddp_spawn's processes are started by the training itself (Lightning: spawned; Accelerate: forked), and
    each one is timed too. A language model's throughput is also in tokens, and its MFU is per token."""
    overrides = [*TINY_GPT, "data.batch_size=8", "strategy=ddp_spawn", "bench.devices=[2]", "bench.peak_tflops=1"]
    _, (row,) = bench(tmp_path, train_env, *overrides, "logger=none")

    assert int(row["devices"]) == 2 and int(row["global_batch"]) == 16
    samples_per_s, tokens_per_s = float(row["samples_per_s"]), float(row["tokens_per_s"])
    assert tokens_per_s == pytest.approx(16 * samples_per_s)  # data.seq_len=16 predicted tokens per sample
    with torch.device("meta"):
        parameters = sum(p.numel() for p in instantiate(config("train", *TINY_GPT).model.net).parameters())
    # 6 FLOPs per parameter per token (forward 2, backward 4), over 2 devices of bench.peak_tflops=1
    assert float(row["mfu"]) == pytest.approx(6 * parameters * tokens_per_s / (2 * 1e12))


@pytest.mark.slow
def test_memory_finds_a_larger_batch_with_activation_checkpointing(tmp_path, train_env):
    """`bench memory` on a memory model of a device (simulated_oom.SavedActivationsMLP: what the forward saves for
    the backward must fit 32 KiB): with activation_checkpointing=full each block keeps only its input, so the
    batch-size finder fits a larger batch than with none; each mode's timed point reports its peak memory."""
    run_dir = tmp_path / "bench"
    model = ["model.net._target_=simulated_oom.SavedActivationsMLP", "+model.net.budget_kib=32"]
    args = ["memory", f"hydra.run.dir={run_dir}", *QUICK, *TINY, *model, "data.batch_size=4"]
    args += ["bench.activation_checkpointing=[none,full]", "bench.max_batch_size=64"]
    proc = run_module(f"{PACKAGE}.bench", args, train_env, PROJECT, 600, preload=f"{PACKAGE}.train")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (run_dir / "memory.csv").open() as file:
        none, full = csv.DictReader(file)

    assert (none["activation_checkpointing"], full["activation_checkpointing"]) == ("none", "full")
    assert 4 <= int(none["largest_batch"]) < int(full["largest_batch"]) / 2 < 64 / 2  # 11 and 50
    assert f"largest batch {full['largest_batch']}\n" in proc.stdout, "below bench.max_batch_size: not flagged"
    for row in (none, full):
        assert float(row["peak_memory_mib"]) > 0 and float(row["step_ms"]) > 0
        assert float(row["samples_per_s"]) == pytest.approx(4 / (float(row["step_ms"]) / 1e3))
    # The finder's trial steps are not the timed training's: the clock restarted after the search.
    found = json.loads((run_dir / "points" / "full-find_batch.json").read_text())
    assert len(found["step_ends"]) == 1 and found["largest_batch"] == int(full["largest_batch"])
    (run,) = offline_runs(run_dir)
    assert next(row for row in run.history if "memory/table/nrows" in row)["memory/table/nrows"] == 2


def test_an_unknown_benchmark_or_mode_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Before any training: an unknown benchmark (the usage line names both) or activation checkpointing mode."""
    monkeypatch.setattr(sys, "argv", ["bench", "speed"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2 and "valid benchmarks: scaling, memory" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["bench", "--help"])
    main()  # the usage, exit 0 (it was the refusal above, exit 2)
    assert "usage: python -m" in capsys.readouterr().out
    # strategy=single's points of 2 processes trained one, and the bench printed an efficiency of them
    run_dir = tmp_path / "single"
    monkeypatch.setattr(
        sys, "argv", ["bench", "scaling", "strategy=single", "bench.devices=[1,2]", f"hydra.run.dir={run_dir}"]
    )
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2 and "strategy=single trains one: give strategy=ddp" in capsys.readouterr().err
    assert not run_dir.exists()
    # What the preset refuses, by the training's own checks: the point of 2 processes failed after the first had run.
    lazy = ["strategy=ddp", "trainer.accelerator=cpu", "model.net._target_=own_models.LazyFirstLayer"]
    monkeypatch.setattr(sys, "argv", ["bench", "scaling", *lazy, f"hydra.run.dir={run_dir}"])
    environment = dict(os.environ)  # (the checks build the training's objects in this process)
    try:
        with pytest.raises(SystemExit) as exit_:
            main()
    finally:
        os.environ.clear()
        os.environ.update(environment)
    assert exit_.value.code == 2 and "LazyFirstLayer's embed.weight (LazyLinear) has no size" in capsys.readouterr().err
    assert not run_dir.exists()
    monkeypatch.setattr(sys, "argv", ["bench", "memory", "+bench.step=2", f"hydra.run.dir={run_dir}"])  # (read by name)
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2 and "error: +bench.step: the bench reads no bench.step, only the settings it has: " \
        "activation_checkpointing, devices, find_batch," in capsys.readouterr().err  # fmt: skip
    assert not run_dir.exists()
    # argparse's habit: the hint names the bench's own key, or the trainer's (it named bench.max_epochs)
    for flag, key in [("--steps", "bench.steps"), ("--max-epochs", "trainer.max_epochs"), ("--seed", "seed")]:
        monkeypatch.setattr(sys, "argv", ["bench", "scaling", flag, "2"])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code == 2 and f"e.g. {key}=... (--help lists them)" in capsys.readouterr().err
    with pytest.raises(
        ConfigError,
        match=r"bench.activation_checkpointing=\['none', 'partial'\] must list modes among none, full, selective",
    ):
        memory(config("bench", "bench.activation_checkpointing=[none,partial]"), [], tmp_path, None)
    with pytest.raises(ConfigError, match="activation_checkpointing=full recomputes each block of the model's Split"):
        memory(config("bench", "model.net._target_=torch.nn.Identity"), [], tmp_path, None)
    assert not list(tmp_path.iterdir())


BAD_SETTINGS = [  # each was a traceback (or, bench.devices=[1.5], a point of 1.5 processes), leaving a run folder
    ("scaling", "bench.devices=abc", "bench.devices=abc must list process counts >= 1, e.g. [1,2,4]"),
    ("scaling", "bench.devices=2", "bench.devices=2 must list process counts >= 1, e.g. [1,2,4]; give a list: [2]"),
    ("scaling", "bench.devices=[1.5]", "bench.devices=[1.5] must list process counts >= 1"),
    ("scaling", "bench.steps=2.5", "bench.steps=2.5 must be a whole number >= 2"),  # failed in the first point
    ("scaling", "bench.peak_tflops=abc", "bench.peak_tflops=abc must be a number > 0"),
    ("memory", "bench=null", "bench=null: bench is a group of settings; give them one by one, e.g. bench.steps=20"),
    # the training's own checks, of the value given (a weak-scaled point's was named: data.batch_size=-16 for -8)
    ("scaling", "data.batch_size=-8", "data.batch_size=-8 is the global batch and must be a positive multiple of"),
    ("memory", "model.optimizer.lr=-1", "model.optimizer: Invalid learning rate: -1"),
    (
        "memory",
        "bench.activation_checkpointing=full",
        "must list modes among none, full, selective; give a list: [full]",
    ),
]


@pytest.mark.parametrize(("benchmark", "setting", "message"), BAD_SETTINGS)
def test_a_bad_setting_is_refused_before_any_point(tmp_path, benchmark, setting, message):
    run = scaling if benchmark == "scaling" else memory
    with pytest.raises(ConfigError, match=re.escape(message)):
        run(config("bench", setting), [], tmp_path, None)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # starts the bench in its own process
def test_a_bad_setting_is_refused_in_one_line(tmp_path, train_env):
    """The command line: exit 2, the refusal alone, and no run folder left (bench.devices=abc and =2 were a
    TypeError's traceback, exit 1, and an empty run folder)."""
    run_dir = tmp_path / "bench"
    for setting, message in [row[1:] for row in BAD_SETTINGS[:2]]:
        args = ["scaling", f"hydra.run.dir={run_dir}", setting]
        proc = run_module(f"{PACKAGE}.bench", args, train_env, PROJECT, 120, preload=f"{PACKAGE}.train")
        output = proc.stdout + proc.stderr
        assert proc.returncode == 2, output[-3000:]
        assert output.strip() == f"error: {message}"
        assert not run_dir.exists()


def test_mfu_uses_the_precision_training_resolves(monkeypatch):
    """On an H100, trainer.precision=auto trains in bf16-mixed: MFU is over the bf16 peak. A made-up machine: one
    GPU that torch sees and NVML describes (compute capability 9.0)."""
    monkeypatch.setattr(hardware, "pynvml", FakeNVML([FakeGPU("GPU-0", 0, 0x18, 0, 0, capability=(9, 0))]))
    hardware.nvml_ready.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    try:
        assert peak_flops(config("bench")) == 989e12  # precision: auto, the default
        assert peak_flops(config("bench", "trainer.precision=32")) is None  # no fp32 peak in the table
        assert peak_flops(config("bench", "trainer.accelerator=cpu")) is None
    finally:
        hardware.nvml_ready.cache_clear()


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_peak_of_each_gpu_is_its_own(name, tflops):
    assert peak_bf16_flops(name) == (tflops * 1e12 if tflops else None)


def test_a_point_past_its_limit_says_where_it_was(tmp_path, train_env):
    """The step count the clock keeps tells start-up (or a first step compiling), warm-up and timed steps apart."""
    progress = tmp_path / "1.progress"
    assert phase(progress, 5, 25).startswith("before its first step ended")
    progress.write_text("3")
    assert phase(progress, 5, 25) == "in its warm-up steps (3 of 5 done)"
    progress.write_text("12")
    assert phase(progress, 5, 25) == "in its timed steps (7 of 20 done)"

    run_dir = tmp_path / "bench"
    command = [sys.executable, "-m", f"{PACKAGE}.bench", "scaling", f"hydra.run.dir={run_dir}", *QUICK, *TINY]
    slow = ["bench.devices=[1]", "bench.timeout_s=1", "logger=none"]  # 1 s: the training is still importing torch
    proc = subprocess.run([*command, *slow], env=train_env, capture_output=True, text=True, timeout=120, cwd=PROJECT)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ran past bench.timeout_s=1 s before its first step ended (start-up, or the first step" in proc.stderr


@pytest.mark.parametrize(
    "depth, compile, recompute, said",
    [
        (2, False, "none", "interleaved_1f1b, zbv left out: 2 blocks, fewer than 2 stages per process take"),
        (4, True, "none", "zbv left out: compile=true"),
        (4, False, "selective", "zbv left out: activation_checkpointing=selective"),
        (4, False, "full", ""),
        (
            2,
            True,
            "none",
            "interleaved_1f1b left out: 2 blocks, fewer than 2 stages per process take; zbv left out: compile=true",
        ),
    ],
)
def test_a_pipeline_point_says_which_schedules_it_leaves_out(depth, compile, recompute, said):
    cfg = OmegaConf.create({"compile": compile, "activation_checkpointing": recompute, "strategy": {}})
    net = ResidualMLP(in_features=4, num_classes=2, hidden=8, depth=depth)
    schedules = pipeline_schedules(cfg, net, 2)
    assert left_out(cfg, net, 2, schedules) == said
