"""`python -m {{ cookiecutter.package_name }}.doctor`, run for real on this machine (CPU, gloo, no NVML here), and its
parts in-process: the sizes at each precision, the decision tree, and NVML's answers on a made-up GPU machine."""

import dataclasses
import functools
import json
import re
import subprocess
from pathlib import Path

import custom_dataset
import pytest
import torch
from fake_nvml import FakeGPU, FakeNVML
from forked import run_module
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.config.objects import register_resolvers
from {{ cookiecutter.package_name }}.config.overrides import check_overrides
from {{ cookiecutter.package_name }}.doctor import Speed, diagnose, recommend, step_seconds, unpriced
from {{ cookiecutter.package_name }}.engine.launching import DP_GATHERS_OUTPUTS, train_command
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.runtime import hardware
from {{ cookiecutter.package_name }}.runtime.precision import resolve_precision
from {{ cookiecutter.package_name }}.tools.estimate import FP32, ModelFacts, dp_memory, memory_per_device, model_facts

PACKAGE = "{{ cookiecutter.package_name }}"
NO_BANDWIDTH = "doctor.allreduce.sizes_mb=[]"  # the plans below do not need the (seconds long) measurement


def doctor(tmp_path: Path, env: dict[str, str], *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "doctor"
    args = [f"hydra.run.dir={run_dir}", *overrides]
    proc = run_module(f"{PACKAGE}.doctor", args, env, tmp_path, 300, preload=f"{PACKAGE}.train")  # CI time: forked
    return proc, run_dir


def report(tmp_path: Path, env: dict[str, str], *overrides: str) -> dict:
    proc, run_dir = doctor(tmp_path, env, *overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = run_dir / "doctor.json"
    assert f"report written to {path}" in proc.stdout
    return json.loads(path.read_text())


def config(*overrides: str):
    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("doctor", overrides=list(overrides))


def configured_net(*overrides: str) -> torch.nn.Module:
    return instantiate(config(*overrides).model.net)


@pytest.mark.slow  # starts the doctor in its own process
def test_doctor_on_cpu(tmp_path, train_env):
    """Environment, empty GPU sections with their reason, a measured all-reduce, the model and its arithmetic."""
    proc, run_dir = doctor(tmp_path, train_env, "model.net.hidden=64", "doctor.allreduce.iterations=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"report written to {run_dir / 'doctor.json'}" in proc.stdout
    result = json.loads((run_dir / "doctor.json").read_text())

    env = result["environment"]
    assert env["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert env["gpus"] == [] and "no CUDA device" in env["why_no_gpus"]
        assert result["topology"]["pairs"] == [] and result["topology"]["why_empty"]

    bandwidth = result["allreduce"]
    n = bandwidth["processes"]
    assert n >= 2 and len(bandwidth["sizes"]) == 3
    for row in bandwidth["sizes"]:  # nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n
        assert row["algbw_gbs"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 2 * (n - 1) / n)

    model = result["model"]
    net = configured_net("model.net.hidden=64")
    assert model["parameters"] == sum(p.numel() for p in net.parameters())
    assert model["optimizer_state_bytes_per_parameter"] == 8  # AdamW: exp_avg and exp_avg_sq in fp32
    assert model["activation_bytes_per_sample"] > 0
    assert model["step_seconds_one_device"] > 0
    assert model["precision"] == resolve_precision("auto", "auto")  # trainer.precision=auto, as train resolves it

    params, batch = model["parameters"], model["global_batch"]
    state = params * (4 + 4 + 8)
    single = next(row for row in result["memory"] if row["preset"] == "single" and row["devices"] == 1)
    assert single["bytes"] == pytest.approx(state + model["activation_bytes_per_sample"] * batch)
    busbw = bandwidth["sizes"][-1]["busbw_gbs"]
    for row in result["traffic"]:  # ring 2(N/P)(P-1) per device, parameter server N(P-1)
        p = row["devices"]
        assert row["gradient_bytes"] == 4 * params
        assert row["ring_bytes_per_device"] == pytest.approx(2 * 4 * params / p * (p - 1))
        assert row["parameter_server_bytes"] == pytest.approx(4 * params * (p - 1))
        assert row["ring_seconds"] == pytest.approx(row["ring_bytes_per_device"] / (busbw * 1e9))

    # dp's device 0 holds the optimizer state the other devices do not: it fills first, and the output says so.
    dp = [row for row in result["memory"] if row["preset"] == "dp" and row["devices"] > 1]
    assert dp and all(row["bytes"] - row["other_devices_bytes"] >= 8 * params for row in dp)
    assert f"dp fills device 0 first: over {dp[-1]['devices']} devices" in " ".join(proc.stdout.split())

    advice = result["recommendation"]
    if not torch.cuda.is_available():  # one CPU: one device
        assert advice["preset"] == "single"
        assert advice["command"] == f"python -m {PACKAGE}.train strategy=single model.net.hidden=64"


@pytest.mark.slow
def test_doctor_splits_a_model_too_big_for_pretend_devices(tmp_path, train_env):
    """4 devices of 5 MB: one replica (~14 MB) fits on none, sharded over 4 it does."""
    result = report(tmp_path, train_env, NO_BANDWIDTH, "doctor.device_memory_gb=0.005", "doctor.devices=4")
    usable = 0.9 * 0.005e9
    assert result["plan"]["this_machine"] is False  # planned hardware: nothing measured here prices it
    single = next(row for row in result["memory"] if row["preset"] == "single" and row["devices"] == 1)
    assert single["bytes"] > usable
    advice = result["recommendation"]
    assert advice["preset"] in ("fsdp", "model_parallel", "pipeline") and advice["nodes"] == 1
    assert advice["bytes_per_device"] <= usable
    assert f"strategy={advice['preset']}" in advice["command"]
    fsdp = next(row for row in result["memory"] if row["preset"] == "fsdp" and row["devices"] == 4)
    assert fsdp["bytes"] < single["bytes"] / 3  # weights, gradients, optimizer state and activations: 1/4 each
    if advice["preset"] == "model_parallel":  # every device of the node, in a mesh of dp x tp = 4
        sizes = dict(arg.split("=") for arg in advice["command"].split() if arg.startswith("strategy.") and "=" in arg)
        assert int(sizes["strategy.data_parallel_size"]) * int(sizes["strategy.tensor_parallel_size"]) == 4
        assert advice["devices_per_node"] == 4


@pytest.mark.slow
def test_doctor_plans_several_nodes(tmp_path, train_env):
    """2 devices of 5 MB per node are not enough: the plan spans nodes, launched with torchrun on each."""
    result = report(tmp_path, train_env, NO_BANDWIDTH, "doctor.device_memory_gb=0.005", "doctor.devices=2")
    advice = result["recommendation"]
    assert advice["preset"] == "model_parallel" and advice["nodes"] >= 2
    assert advice["bytes_per_device"] <= 0.9 * 0.005e9
    assert advice["command"].startswith(f"torchrun --nnodes={advice['nodes']} --nproc_per_node=2 ")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("doctor.device_memory_gb=-1", "doctor.device_memory_gb=-1 must be a number > 0 (GB per device)"),
        ("doctor.devices=abc", "doctor.devices=abc must be a whole number >= 1"),  # was a TypeError's traceback
        # were a ValueError's and a TypeError's traceback, leaving an empty run folder
        ("doctor.allreduce.sizes_mb=[abc]", "doctor.allreduce.sizes_mb=[abc] must list message sizes in MB > 0, e.g."),
        (
            "doctor.allreduce.sizes_mb=5",
            "doctor.allreduce.sizes_mb=5 must list message sizes in MB > 0, e.g. [0.25,2,16] "
            "([] skips the measurement); give a list: [5]",
        ),
        ("doctor.allreduce.sizes_mb=[-1]", "doctor.allreduce.sizes_mb=[-1] must list"),  # was negative bandwidths
        # was seconds of measuring, then a StatisticsError's traceback (here refused though nothing is measured)
        ("doctor.allreduce.iterations=0", "doctor.allreduce.iterations=0 must be a whole number >= 1"),
        ("doctor.min_speedup=-3", "doctor.min_speedup=-3 must be a number >= 1"),  # was taken silently
        # an AttributeError's traceback, and an empty run folder
        ("doctor.allreduce=null", "doctor.allreduce=null: doctor.allreduce is a group of settings; give them one by"),
    ],
)
def test_doctor_rejects_a_nonsense_device_plan(tmp_path, train_env, setting, message):
    proc, run_dir = doctor(tmp_path, train_env, NO_BANDWIDTH, setting)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert f"error: {message}" in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output  # the refusal, nothing else
    assert not run_dir.exists()


def test_a_key_added_to_the_doctors_settings_is_refused():
    """The doctor reads its settings by name: `+doctor.foo=1` planned without a word (the command line's check, in
    the process: the table above starts a doctor per row)."""
    taken = "only the settings it has: allreduce, device_counts, device_memory_gb, devices, max_nodes, min_speedup"
    with pytest.raises(ConfigError, match=re.escape(f"+doctor.foo: the doctor reads no doctor.foo, {taken}")):
        check_overrides(["+doctor.foo=1"], "doctor")
    with pytest.raises(ConfigError, match=re.escape("+doctor.allreduce.size: the doctor reads no doctor.allreduce.")):
        check_overrides(["+doctor.allreduce.size=1"], "doctor")


@pytest.mark.parametrize(
    ("setting", "message"),
    [  # the training's own refusals, before anything is measured: each was a traceback and an empty run folder
        ("data.batch_size=0", "data.batch_size=0 is the global batch and must be a positive multiple of the 1 data-"),
        ("model.optimizer.lr=-1", "model.optimizer: Invalid learning rate: -1"),
        ("model.net._target_=torch.nn.Linear", "torch.nn.Linear: Linear.__init__() got an unexpected keyword argument"),
    ],
)
def test_the_trainings_own_checks_come_first(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        diagnose(config(setting, NO_BANDWIDTH), [])


def test_a_net_with_nothing_to_train_is_refused_before_anything_is_measured():
    """A net without trainable parameters (a frozen one, nn.Identity): the doctor's timed step was a traceback, an
    empty run folder left behind."""
    with pytest.raises(ConfigError, match=r"model.net Identity has no trainable parameters \(none, or every one"):
        model_facts(config("model.net._target_=torch.nn.Identity"), 8, [], "32-true")


def test_activations_are_sized_at_the_precision_training_uses():
    """bf16-mixed saves activations and outputs in 16 bits: half of 32-true's; weights, gradients and optimizer
    state stay fp32. The step is timed under the same autocast."""
    cfg = config("model.net.hidden=64", "model.net.depth=2")
    full, mixed = (model_facts(cfg, 16, [2], precision) for precision in ("32-true", "bf16-mixed"))
    assert mixed.activation_bytes_per_sample == pytest.approx(full.activation_bytes_per_sample / 2)
    assert mixed.output_bytes_per_sample == pytest.approx(full.output_bytes_per_sample / 2)
    assert full.output_bytes_per_sample == FP32 * cfg.data.num_classes  # one logit per class
    assert mixed.stage_activation_bytes_per_sample[2] == pytest.approx(
        [nbytes / 2 for nbytes in full.stage_activation_bytes_per_sample[2]]
    )
    assert mixed.state_bytes == full.state_bytes
    single = [memory_per_device(facts, "single", 1, 1, 16, 4, "1f1b")[0] for facts in (full, mixed)]
    assert single[0] - single[1] == pytest.approx(full.activation_bytes_per_sample * 16 / 2)
    assert step_seconds(cfg, mixed, 16, host_memory_gb=8, precision="bf16-mixed") > 0


def test_the_model_is_measured_on_a_batch_shaped_like_the_datas_samples(monkeypatch):
    """A dataset of images (3 x 8 x 8) and a convolutional net: the doctor sizes and times the net on a batch shaped
    as the data's first sample (a batch of data.num_features values was a traceback from the first convolution),
    building the dataset once (yours may read files for minutes)."""
    built = []
    build = custom_dataset.Images.__init__
    monkeypatch.setattr(custom_dataset.Images, "__init__", lambda self, *a, **k: built.append(build(self, *a, **k)))
    images = ["data=custom", "data.dataset._target_=custom_dataset.Images", "data.num_features=192"]
    cfg = config(*images, "data.num_classes=4", "model.net._target_=own_models.SmallCNN")
    facts = model_facts(cfg, 4, [2], "32-true")
    assert facts.activation_bytes_per_sample >= FP32 * 8 * 8 * 8, "the convolution's output, per sample"
    assert step_seconds(cfg, facts, 4, host_memory_gb=8, precision="32-true") > 0
    assert len(built) == 1, "the training split, once"


def test_a_split_that_is_not_a_chain_is_sized_without_pipeline_stages():
    """Two towers in a Split (for fsdp and layers): the doctor ran them as a pipeline's chain, a traceback."""
    facts = model_facts(config("model.net._target_=own_models.TwoTowers", "~model.net.depth"), 4, [2], "32-true")
    assert facts.stage_parameters == {} and facts.parameters > 0 and not facts.chain
    held = memory_per_device(facts, "pipeline", 2, 2, 4, 2, "1f1b")[1]
    assert held.startswith("pipeline: the forward is not its Split's")


def test_dp_fills_device_0_first():
    """dp's device 0 keeps the optimizer state (and the reduced gradients) that the other devices do  not, and,
    where the engine gathers them there for the loss (Accelerate), the whole batch's outputs."""
    facts = default_model()
    first, other = dp_memory(facts, 4, 256)
    share = facts.activation_bytes_per_sample * 256 / 4
    assert other == pytest.approx(facts.parameters * 2 * FP32 + share)
    gathered = 3 * facts.output_bytes_per_sample * 256  # the outputs, the loss's softmax and their gradient
    assert first == pytest.approx(facts.state_bytes + share + (gathered if DP_GATHERS_OUTPUTS else 0))
    assert memory_per_device(facts, "dp", 4, 4, 256, 4, "1f1b")[0] == first


@functools.cache
def default_model() -> ModelFacts:
    return model_facts(config(), 256, [2, 3, 4], "32-true")


class TestRecommendation:
    """The decision tree on the default model's real sizes (batch 256), on devices of chosen sizes."""

    pipe = OmegaConf.create({"microbatches": 4, "schedule": "1f1b"})
    fast = Speed(step_seconds=0.4, busbw_gbs=100.0)  # all-reduce of ~2 MB of gradients: ~0.03 ms

    def need(self, preset: str, devices: int, per_node: int = 4, batch: int = 256) -> float:
        return memory_per_device(default_model(), preset, devices, per_node, batch, 4, "1f1b")[0]

    def advise(
        self,
        usable: float,
        per_node: int,
        speed: Speed = fast,
        pcie_only: bool | None = False,
        batch: int = 256,
        overrides: tuple[str, ...] = ("seed=1",),
        own: tuple[str, str] | None = None,
    ) -> dict:
        plan = OmegaConf.create({"min_speedup": 1.2, "max_nodes": 4})
        model = default_model()
        return recommend(model, usable, per_node, plan, batch, self.pipe, speed, pcie_only, list(overrides), own)

    def test_one_device(self):
        advice = self.advise(usable=1e12, per_node=1)
        assert advice["preset"] == "single" and advice["command"] == f"python -m {PACKAGE}.train strategy=single seed=1"

    def test_the_layout_of_the_doctors_command_line_gives_way_to_the_recommended_one(self):
        """The doctor's command line with a strategy: the recommended command has the recommended one only (it
        had both, `strategy=single strategy=ddp`, which the training refused); a batch that divides over none of
        the devices says so (it said there was one device)."""
        mine = ("strategy=ddp", "trainer.devices=2", "strategy.find_unused_parameters=true", "seed=1")
        advice = self.advise(usable=1e12, per_node=2, batch=255, overrides=mine)
        assert advice["command"] == f"python -m {PACKAGE}.train strategy=single seed=1"
        assert "data.batch_size=255 (the global batch) divides over none of the other device counts" in advice["why"]

    def test_a_preset_file_of_yours_is_recommended_by_its_name_with_its_settings(self):
        """strategy=my_ddp (ddp.yaml copied): where the doctor recommends ddp, the command keeps the user's preset
        and its strategy.X settings (it named ddp and dropped them)."""
        mine = ("strategy=my_ddp", "strategy.timeout.minutes=5", "seed=1")
        advice = self.advise(usable=1e12, per_node=4, overrides=mine, own=("my_ddp", "ddp"))
        words = advice["command"].split()
        assert advice["preset"] == "ddp" and "strategy=my_ddp" in words and "strategy=ddp" not in words
        assert "strategy.timeout.minutes=5" in words and words[-1] == "seed=1"

    def test_ddp_when_it_is_faster(self):
        advice = self.advise(usable=1e12, per_node=4)
        assert advice["preset"] == "ddp" and advice["devices_per_node"] == 4
        assert "ddp over 4 is ~4.0x faster" in advice["why"]
        assert advice["basis"].startswith("measured here: one step 400.0 ms on one device")

    def test_ddp_of_a_net_with_parameters_its_forward_leaves_out_is_told_so(self):
        """A head the forward does not use (own_models.WithUnusedHead): the recommended ddp command stopped at its
        first step (parameters of the model got no gradient) without strategy.find_unused_parameters=true."""
        cfg = config()
        cfg.model.net._target_ = "own_models.WithUnusedHead"
        facts = model_facts(cfg, 256, [2], "32-true")
        assert facts.unused == ("auxiliary.weight", "auxiliary.bias") and default_model().unused == ()
        plan = OmegaConf.create({"min_speedup": 1.2, "max_nodes": 4})
        advice = recommend(facts, 1e12, 4, plan, 256, self.pipe, self.fast, False, [])
        assert advice["preset"] == "ddp" and advice["command"].endswith("strategy.find_unused_parameters=true")
        assert "find_unused" not in self.advise(usable=1e12, per_node=4)["command"]

    def test_one_device_when_ddp_is_not_faster_enough(self):
        slow_links = Speed(step_seconds=0.001, busbw_gbs=0.01)  # the all-reduce alone takes ~0.3 s
        advice = self.advise(usable=1e12, per_node=4, speed=slow_links)
        assert advice["preset"] == "single"
        assert "would be only" in advice["why"] and "all-reduce" in advice["basis"]

    def test_ddp_unpriced_for_planned_devices(self):
        """doctor.devices / device_memory_gb: this machine's step and bandwidth do not price the plan."""
        why = unpriced(step=0.4, busbw=100.0, elsewhere=True, per_node=8, memory_gb=80)
        assert "not those of the planned 8 x 80 GB devices" in why
        advice = self.advise(usable=1e12, per_node=8, speed=Speed(0.4, 100.0, unknown=why))
        assert advice["preset"] == "ddp" and f"not estimated: {why}" in advice["why"] and "basis" not in advice
        assert unpriced(step=0.4, busbw=None, elsewhere=False, per_node=8, memory_gb=80).endswith("sizes_mb=[])")
        assert unpriced(step=0.4, busbw=100.0, elsewhere=False, per_node=8, memory_gb=80) is None

    def test_ddp_over_fewer_devices_than_the_node_says_why(self):
        """doctor.devices=3 and the global batch 256: ddp over 2, and the command said trainer.devices=2 unexplained."""
        why = unpriced(step=0.4, busbw=100.0, elsewhere=True, per_node=3, memory_gb=80)
        advice = self.advise(usable=1e12, per_node=3, speed=Speed(0.4, 100.0, unknown=why))
        assert advice["preset"] == "ddp" and advice["devices_per_node"] == 2
        assert "does not divide over 3; give a multiple of 3" in advice["why"]
        advice = self.advise(usable=1e12, per_node=4, speed=Speed(0.4, 100.0, unknown=why))
        assert advice["devices_per_node"] == 4 and "divide" not in advice["why"]

    def test_fsdp_when_a_replica_does_not_fit(self):
        usable = 1.05 * self.need("fsdp", 2)
        assert self.need("single", 1) > usable and self.need("ddp", 4) > usable
        advice = self.advise(usable, per_node=4)
        assert advice["preset"] == "fsdp" and advice["devices_per_node"] == 4 and advice["nodes"] == 1
        assert advice["bytes_per_device"] <= usable < self.need("fsdp", 2) * 1.1
        assert "strategy=fsdp" in advice["command"]

    def test_no_preset_that_refuses_batchnorm(self):
        """A model with BatchNorm that fits no replica: fsdp, model_parallel and pipeline refuse it (statistics not
        the whole batch's), so none is recommended (fsdp was, whose command then failed) nor priced in the table."""
        usable = 1.05 * self.need("fsdp", 2)
        batchnorm = dataclasses.replace(default_model(), batchnorm=True)
        advice = recommend(batchnorm, usable, 4, OmegaConf.create({"min_speedup": 1.2, "max_nodes": 4}), 256,
                           self.pipe, self.fast, False, [])  # fmt: skip
        assert advice["preset"] is None
        assert "fsdp, model_parallel's tensor mode and pipeline refuse it" in advice["why"]  # more nodes cannot help
        assert "more nodes" not in advice["why"] and "strategy.mode=layers" in advice["why"]
        for preset in ("fsdp", "model_parallel", "pipeline", "dp"):
            held = memory_per_device(batchnorm, preset, 2, 4, 256, 4, "1f1b")[1]
            assert held.startswith(f"{preset} refuses BatchNorm")
        assert "strategy.mode=layers" in memory_per_device(batchnorm, "model_parallel", 2, 4, 256, 4, "1f1b")[1]
        assert memory_per_device(batchnorm, "fsdp", 1, 4, 256, 4, "1f1b")[0], "one process: BatchNorm over the batch"

    def test_no_preset_that_wraps_a_lazy_layer_before_it_is_sized(self):
        """A LazyLinear (own_models.LazyFirstLayer): ddp was recommended, whose command the training refuses (the
        presets that wrap or split the net take it before the first forward sizes the layer)."""
        cfg = config("model.net._target_=own_models.LazyFirstLayer")
        lazy = model_facts(cfg, 256, [2], "32-true")
        assert lazy.lazy == "embed.weight" and default_model().lazy is None
        plan = OmegaConf.create({"min_speedup": 1.2, "max_nodes": 4})
        advice = recommend(lazy, 1e12, 4, plan, 256, self.pipe, self.fast, False, [])
        assert advice["preset"] == "single" and "give that layer its sizes to train on 4" in advice["why"]
        assert "strategy=single" in advice["command"]
        for preset in ("ddp", "fsdp", "model_parallel", "pipeline"):
            nbytes, held = memory_per_device(lazy, preset, 2, 4, 256, 4, "1f1b")
            assert nbytes is None and "refuse a lazy layer" in held and held.endswith("sizes embed.weight")
        assert memory_per_device(lazy, "dp", 2, 4, 256, 4, "1f1b")[0], "dp sizes it at the first step"
        small = 1.05 * self.need("fsdp", 2)  # no replica fits: no preset can shard it either
        advice = recommend(lazy, small, 4, plan, 256, self.pipe, self.fast, False, [])
        assert advice["preset"] is None and "(a lazy layer): give the layer its sizes" in advice["why"]

    def test_no_fsdp_of_a_0_dim_parameter(self):
        """A learned temperature (own_models.LearnedTemperature): fsdp was recommended, which FSDP2 cannot shard."""
        cfg = config("model.net._target_=own_models.LearnedTemperature")
        scalar = model_facts(cfg, 256, [2, 3, 4], "32-true")
        assert scalar.scalar == "temperature" and default_model().scalar is None
        usable = 1.05 * self.need("fsdp", 2)  # no replica fits; fsdp over the node would
        plan = OmegaConf.create({"min_speedup": 1.2, "max_nodes": 4})
        advice = recommend(scalar, usable, 4, plan, 256, self.pipe, self.fast, False, [])
        assert advice["preset"] != "fsdp"
        assert memory_per_device(scalar, "fsdp", 4, 4, 256, 4, "1f1b") == (
            None,
            "fsdp cannot shard the 0-dim parameter temperature (FSDP2)",
        )
        assert memory_per_device(scalar, "model_parallel", 4, 4, 256, 4, "1f1b", tensor=2)[0] is None  # dp=2: FSDP2
        assert memory_per_device(scalar, "model_parallel", 4, 4, 256, 4, "1f1b", tensor=4)[0]  # tensor parallel only

    def test_model_parallel_when_fsdp_over_the_node_does_not_fit(self):
        """A tensor-parallel group reads one batch: a batch of 2 does not split over 4 FSDP2 processes, it does over
        a 2 x 2 mesh (the smallest tensor-parallel group that fits)."""
        usable = 1.05 * self.need("model_parallel", 2, batch=2)
        advice = self.advise(usable, per_node=4, batch=2)
        assert advice["preset"] == "model_parallel" and advice["devices_per_node"] == 4 and advice["nodes"] == 1
        assert "strategy.tensor_parallel_size=2 strategy.data_parallel_size=2" in advice["command"]
        assert "assumes NVLink" in self.advise(usable, per_node=4, pcie_only=None, batch=2)["why"]  # links not seen

    def test_pipeline_over_pcie_only(self):
        """A pipeline of 2 stages fits; the node's other 2 devices run a second one beside it (pipeline x data
        parallel), each pipeline with half the batch: less memory per device than one pipeline of 2."""
        usable = 1.05 * self.need("model_parallel", 2)
        assert self.need("pipeline", 2) <= usable
        advice = self.advise(usable, per_node=4, pcie_only=True)
        assert advice["preset"] == "pipeline" and advice["devices_per_node"] == 4
        assert advice["why"].startswith("GPUs linked by PCIe only: cut into 2 stages (stage 0: blocks 0-1, stage 1")
        assert advice["why"].endswith("; 2 such pipelines side by side use all 4 devices")
        extra = ["strategy.split_points=[2]", "strategy.data_parallel_size=2", "seed=1"]
        assert advice["command"] == " ".join(train_command("pipeline", 4, 1, extra))
        two_pipelines = memory_per_device(default_model(), "pipeline", 4, 4, 256, 4, "1f1b", pipelines=2)
        assert advice["bytes_per_device"] == two_pipelines[0] < self.need("pipeline", 2)
        assert two_pipelines[1].startswith("2 pipelines of 2 stages, 1f1b, 4 micro-batches")
        # A batch that does not split over 2 pipelines' micro-batches: one pipeline, 2 devices
        advice = self.advise(usable, per_node=4, pcie_only=True, batch=4)
        assert advice["devices_per_node"] == 2 and "data_parallel_size" not in advice["command"]

    def test_several_nodes(self):
        usable = 0.95 * min(self.need("model_parallel", 2, per_node=2), self.need("pipeline", 2, per_node=2))
        advice = self.advise(usable, per_node=2)
        assert advice["preset"] == "model_parallel" and advice["nodes"] == 2
        assert advice["bytes_per_device"] <= usable
        assert advice["command"].startswith("torchrun --nnodes=2 --nproc_per_node=2 ")

    def test_nothing_fits(self):
        advice = self.advise(usable=1000.0, per_node=2)
        assert advice["preset"] is None and "does not fit even on 4 nodes x 2 devices" in advice["why"]


# A made-up node: NVML's GPUs 0 and 1 joined by two NVLinks on socket 0, GPUs 2 and 3 on socket 1 (PCIe only).
SOCKETS = FakeNVML(
    [
        FakeGPU("GPU-0-aaaa", 0, 0x18, memory_used=1_000_000_000, numa_node=0, nvlinks=("00000000:19:00.0",) * 2),
        FakeGPU("GPU-1-bbbb", 0, 0x19, memory_used=2_000_000_000, numa_node=0, nvlinks=("00000000:18:00.0",) * 2),
        FakeGPU("GPU-2-cccc", 0, 0x86, memory_used=3_000_000_000, numa_node=1),
        FakeGPU("GPU-3-dddd", 0, 0x87, memory_used=4_000_000_000, numa_node=1),
    ],
    ancestors={
        frozenset((0, 1)): 10,  # NVML_TOPOLOGY_SINGLE: one PCIe switch
        frozenset((2, 3)): 10,
        **{frozenset((a, b)): 50 for a in (0, 1) for b in (2, 3)},  # NVML_TOPOLOGY_SYSTEM: across sockets
    },
    p2p={frozenset((0, 1)), frozenset((2, 3))},
    count_fails=True,  # the GPUs are found without NVML's count
)


@pytest.fixture
def nvml(monkeypatch):
    """Puts a FakeNVML in the place of the pynvml module."""

    def install(fake: FakeNVML) -> None:
        monkeypatch.setattr(hardware, "pynvml", fake)
        hardware.nvml_ready.cache_clear()

    yield install
    hardware.nvml_ready.cache_clear()


def torch_gpus(fake: FakeNVML, visible: list[int]) -> list[dict]:
    """environment()'s GPU list as torch numbers them under CUDA_VISIBLE_DEVICES=<visible>."""
    return [{"index": i, **hardware.identity(props)} for i, props in enumerate(fake.torch_properties(visible))]


def test_nvml_describes_the_gpus_torch_numbers(nvml):
    """CUDA_VISIBLE_DEVICES=3,1,0: torch's GPU 0 is NVML's 3, and only the visible GPUs are paired."""
    nvml(SOCKETS)
    gpus = torch_gpus(SOCKETS, [3, 1, 0])
    assert gpus[1] == {"index": 1, "uuid": "GPU-1-bbbb", "pci_bus_id": "00000000:19:00.0"}
    assert [hardware.gpu_usage(gpu)["memory_used_gb"] for gpu in gpus] == [4.0, 2.0, 1.0]
    assert [hardware.gpu_usage(gpu)["numa_node"] for gpu in gpus] == [1, 0, 0]

    pairs = {tuple(pair["gpus"]): pair for pair in hardware.topology(gpus)["pairs"]}
    assert set(pairs) == {(0, 1), (0, 2), (1, 2)}
    assert pairs[1, 2] | {"gpus": None} == {
        "gpus": None,
        "nvlinks": 2,
        "nvswitch_links": 0,
        "link": "NVLink x2",
        "pcie_path": "PCIe switch",
        "same_socket": True,
        "p2p": True,
    }
    for pair in (pairs[0, 1], pairs[0, 2]):
        assert pair["link"] == "PCIe" and pair["pcie_path"].startswith("across sockets") and pair["p2p"] is False
        assert pair["same_socket"] is False


def test_nvml_finds_a_gpu_by_its_pci_bus_id(nvml):
    """A GPU whose UUID NVML does not know (torch reports a MIG instance's) is found by its PCI bus id."""
    nvml(SOCKETS)
    gpu = torch_gpus(SOCKETS, [2])[0] | {"uuid": "MIG-44444444"}
    assert hardware.gpu_usage(gpu)["memory_used_gb"] == 3.0


def test_nvswitch_links_need_both_gpus_on_the_switch(nvml):
    switched = FakeNVML(
        [
            FakeGPU("GPU-a", 0, 0x10, 0, 0, nvlinks=("switch",) * 6),
            FakeGPU("GPU-b", 0, 0x20, 0, 0, nvlinks=("switch",) * 6),
            FakeGPU("GPU-c", 0, 0x30, 0, 0),  # not on the NVSwitches
        ],
        ancestors={frozenset(pair): 40 for pair in ((0, 1), (0, 2), (1, 2))},
    )
    nvml(switched)
    pairs = hardware.topology(torch_gpus(switched, [0, 1, 2]))["pairs"]
    assert [(pair["gpus"], pair["link"]) for pair in pairs] == [
        ([0, 1], "NVSwitch x6"),
        ([0, 2], "PCIe"),
        ([1, 2], "PCIe"),
    ]


def test_topology_says_why_it_is_empty(nvml):
    nvml(FakeNVML(SOCKETS.gpus, driver=False))
    assert "NVML is not available" in hardware.topology(torch_gpus(SOCKETS, [0, 1]))["why_empty"]
    nvml(SOCKETS)
    assert hardware.topology(torch_gpus(SOCKETS, [0]))["why_empty"] == "1 GPU visible to torch: no device pairs to link"
    unknown = [*torch_gpus(SOCKETS, [0]), {"index": 1, "uuid": "GPU-9", "pci_bus_id": "00000000:99:00.0"}]
    assert hardware.topology(unknown)["why_empty"].endswith("PCI bus id of torch's GPU 1")
