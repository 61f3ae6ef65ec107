"""Every preset is documented and composes; bad input fails early, in one line, leaving nothing behind."""

import os
from pathlib import Path

import pytest
import torch
from conftest import COMMAND_LINE_REFUSALS_BY_ID, refuse_all, unsplit_net
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.config.objects import register_resolvers
from {{ cookiecutter.package_name }}.engine.training import check_settings_read, deterministic_kernels, says_notes
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.runtime.run_folder import HELD_BY_THE_COMMAND

PRESETS = sorted(path.stem for path in (CONFIG_DIR / "strategy").glob("*.yaml"))


def test_every_preset_is_documented_and_builds():
    shipped = {"single", "ddp", "ddp_spawn", "dp", "fsdp", "model_parallel", "pipeline"}
    assert shipped <= set(PRESETS)  # (and presets of yours: docs/strategies.md)
    register_resolvers()
    for preset in PRESETS:
        header = (CONFIG_DIR / "strategy" / f"{preset}.yaml").read_text()
        assert f"# {preset}:" in header, f"{preset}.yaml lacks its 'what it is for' line"
        assert "# Hardware:" in header and "# Launch:" in header, f"{preset}.yaml lacks hardware/launch lines"
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=[f"strategy={preset}"])
        assert instantiate(cfg.strategy).name == preset or preset not in shipped  # (yours: the class it copies)


def test_the_notes_of_the_checks_are_said_once(monkeypatch):
    """`python -m ... trainer.devices=2` checks the config, says its notes, then starts torchrun, whose rank 0 checked
    it again and said them all a second time."""
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK", HELD_BY_THE_COMMAND):
        monkeypatch.delenv(name, raising=False)
    assert says_notes()  # the command itself, or rank 0 of a launcher of yours
    monkeypatch.setenv(HELD_BY_THE_COMMAND, "/run")
    monkeypatch.setenv("RANK", "0")
    assert not says_notes()  # rank 0 of the torchrun this command started
    monkeypatch.delenv(HELD_BY_THE_COMMAND)
    monkeypatch.setenv("RANK", "1")
    assert not says_notes()


# (overrides, the one error line); each refused before training (conftest's `refused` runs them)
BAD_INPUT_BY_ID = {
    "unknown-strategy": (["strategy=warp_drive"], "unknown strategy 'warp_drive'; valid: " + ", ".join(PRESETS)),
    "indivisible-batch": (
        ["strategy=ddp_spawn", "trainer.devices=2", "data.batch_size=255"],
        "data.batch_size=255 is the global batch and must be a positive multiple of the 2 data-parallel replicas",
    ),
    "missing-checkpoint": (["ckpt_path=missing"], "ckpt_path=missing is not a checkpoint folder"),
    "run-folder-under-a-file": (
        [f"hydra.run.dir={Path(__file__)}/run"],
        f"the run folder {Path(__file__)}/run cannot be made: {Path(__file__)} is",
    ),
    "unknown-precision": (
        ["trainer.precision=8"],
        "trainer.precision=8 is unknown; valid: auto, 32-true, bf16-mixed, 16-mixed",
    ),
    "pipeline-one-stage": (  # (its preset's trainer.devices is 2)
        ["strategy=pipeline", "trainer.devices=1"],
        "strategy=pipeline runs one stage per process; 1 process given, use 2+: give trainer.devices=N (this command",
    ),
    "unknown-mode": (
        ["strategy=model_parallel", "strategy.mode=pipes"],
        "strategy.mode='pipes' is unknown; valid: tensor, layers",
    ),
    "pipeline-without-split": (
        ["strategy=pipeline", *unsplit_net()],
        "strategy=pipeline needs to know how to split Sequential: add register_split(Sequential, Split(",
    ),
    "model-parallel-without-split": (
        ["strategy=model_parallel", *unsplit_net()],
        "strategy=model_parallel needs to know how to split Sequential: add register_split(Sequential, Split(",
    ),
    # a forward that adds a position vector after `embed`: the pipeline's chain would train another model
    "pipeline-of-another-forward": (
        ["env:WORLD_SIZE=2", "strategy=pipeline", "model.net._target_=own_models.PositionSummed"],
        "runs PositionSummed's Split as a chain (first, blocks, last, each on the one before's output), but its "
        "forward gives it something else than embed's output for blocks.0: it would train another model",
    ),
    "dataset-that-does-not-import": (
        ["data.dataset._target_=nope.Nope"],
        "data.dataset._target_=nope.Nope cannot be imported (No module named 'nope'); give the full import path",
    ),
    "compile-under-dp": (
        ["strategy=dp", "compile=true"],
        "strategy=dp does not support compile=true: nn.DataParallel copies the net",
    ),
    "value-of-the-wrong-type": (
        ["model.optimizer.lr=abc"],
        "model.optimizer.lr=abc is not a number (the default is 0.001)",
    ),
    "unknown-setting": (
        ["trainer.max_epoch=2"],
        "unknown setting trainer.max_epoch; did you mean trainer.max_epochs?",
    ),
    "not-true-or-false": (
        ["data.shuffle=sometimes"],
        "data.shuffle=sometimes is not true or false (the default is true)",
    ),
    "unknown-accelerator": (
        ["trainer.accelerator=gpuu"],
        "trainer.accelerator=gpuu is unknown; valid: auto, cpu, gpu, cuda",
    ),
    # accelerate launch without its config ran the command itself, once: the advice names that
    "pipeline-of-one-accelerate-launch-process": (
        ["env:ACCELERATE_MIXED_PRECISION=no", "strategy=pipeline", "trainer.devices=1"],
        "strategy=pipeline runs one stage per process; 1 process given, use 2+: accelerate launch started 1 (it does",
    ),
    "no-devices": (["trainer.devices=0"], "trainer.devices=0 is not a device count; valid: 1, 2, ..., or auto (or -1)"),
    "gpu-indices": (  # (the GPUs given, not 0 and 1 whatever they were)
        ["trainer.devices=[2,3]"],
        "is not a device count; valid: 1, 2, ..., or auto (or -1); choose GPUs with CUDA_VISIBLE_DEVICES=2,3 and",
    ),
    "devices-not-a-number": (
        ["strategy=ddp_spawn", "trainer.devices=abc"],
        "trainer.devices=abc is not a device count; valid: 1, 2,",
    ),
    "several-devices-under-single": (
        ["trainer.devices=2"],
        "strategy=single runs one device but trainer.devices=2; for 2 processes: strategy=ddp trainer.devices=2 (this "
        "command starts them under torchrun; or `accelerate launch --config_file launch/multi_process.yaml",
    ),
    "lightning-trainer-setting-by-name": (  # it was "did you mean trainer.max_steps?", another setting
        ["trainer.min_steps=5"],
        "trainer.min_steps is a setting of Lightning's Trainer, not of this loop; it reads: accelerator,",
    ),
    "lightning-only-trainer-setting": (  # Hydra adds it, and the loop ignored it: anomaly detection silently off
        ["+trainer.detect_anomaly=true"],
        "trainer.detect_anomaly is a setting of Lightning's Trainer, not of this loop; it reads: accelerator, "
        "accumulate_grad_batches,",
    ),
    # the Lightning engine's way to another loss: taken in, and the loop trained with its own
    "lightning-model-class": (
        ["+model._target_=my_module.SmoothedLoss"],
        "model._target_ is not a setting of this loop (a loss of yours: engine/loop.py); it reads: net,",
    ),
    "lightning-callbacks-group": (
        ["callbacks=oom"],
        "unknown setting callbacks (callbacks is the Lightning engine's config group; this loop has",
    ),
    "deterministic-of-another-value": (
        ["trainer.deterministic=maybe"],
        "trainer.deterministic=maybe is not true or false",
    ),
    **COMMAND_LINE_REFUSALS_BY_ID,  # (conftest: the same in both engines)
}
if not torch.cuda.is_available():  # what a machine without GPUs refuses
    BAD_INPUT_BY_ID["gpu-without-one"] = (
        ["trainer.accelerator=gpu"],
        "trainer.accelerator=gpu, but torch sees no CUDA device",
    )
BAD_INPUT, BAD_INPUT_IDS = list(BAD_INPUT_BY_ID.values()), list(BAD_INPUT_BY_ID)  # (ids beside their rows)


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=BAD_INPUT_IDS)
def test_bad_input_fails_in_one_line(refused, case):
    refused[case].assert_rejected(BAD_INPUT[case][1])


def test_a_launchers_mixed_precision_that_is_not_the_projects_is_refused(tmp_path, train_env):
    """`accelerate launch --mixed_precision bf16` trained in fp32 without a word: the Accelerator is given
    trainer.precision, which wins over the launcher's."""
    env = {**train_env, "ACCELERATE_MIXED_PRECISION": "bf16"}
    refused, agreeing = refuse_all(tmp_path, env, [[], ["trainer.precision=bf16-mixed", "check_only=true"]])
    refused.assert_rejected("accelerate launch --mixed_precision bf16 (or its config) is not trainer.precision=32-true")
    assert agreeing.returncode == 0 and "passes its checks" in agreeing.output


@pytest.mark.parametrize("preset", ["pipeline", "model_parallel"])
def test_16_mixed_is_refused_where_one_gradient_scaler_cannot_serve_every_part(preset):
    """On a GPU (16-mixed on the CPU trains in bf16-mixed, as in Lightning): a config as a GPU run resolves it."""
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR), job_name="train"):
        cfg = compose("train", overrides=[f"strategy={preset}"])
    cfg.trainer.precision = "16-mixed"
    with pytest.raises(
        ConfigError, match=f"strategy={preset} supports trainer.precision=32-true or bf16-mixed, not 16"
    ):
        instantiate(cfg.strategy).check_layout(2, None, cfg)  # (the precision: checked first)


def test_a_model_setting_an_interpolation_reads_is_taken():
    """`+model.width=8 model.net.hidden=${model.width}`: a value of yours that the net's settings read (config.py lets
    an added key that an interpolation reads through too); one nothing reads is refused."""
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIG_DIR), job_name="train"):
        read = compose("train", overrides=["+model.width=8", "model.net.hidden=${model.width}"])
        unread = compose("train", overrides=["+model.colour=red"])
    check_settings_read(read)
    with pytest.raises(ConfigError, match="model.colour is not a setting of this loop; it reads: net, optimizer, no_"):
        check_settings_read(unread)


def test_ddps_options_reach_accelerates_ddp_handler():
    """+strategy.static_graph=true (taken as in the Lightning engine) reaches DistributedDataParallel's arguments."""
    from accelerate.utils import DistributedDataParallelKwargs

    ddp = instantiate(OmegaConf.load(CONFIG_DIR / "strategy" / "ddp.yaml").strategy, static_graph=True)
    [handler] = [h for h in ddp.accelerator_kwargs()["kwargs_handlers"] if isinstance(h, DistributedDataParallelKwargs)]
    assert handler.static_graph and not handler.find_unused_parameters
    assert set(ddp.passed_on) <= set(DistributedDataParallelKwargs.__dataclass_fields__)


def test_a_world_size_left_from_another_job_is_refused(tmp_path, train_env):
    """WORLD_SIZE=2 left in the shell, no launcher: the Accelerator waited for processes that never come (for ever,
    MASTER_ADDR and MASTER_PORT set too), or said MASTER_ADDR was missing, in a traceback."""
    env = {**train_env, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29613"}
    (refused,) = refuse_all(tmp_path, env, [["strategy=ddp"]])
    refused.assert_rejected("WORLD_SIZE=2 is set, but no launcher (torchrun, accelerate launch, srun) started this")


def test_deterministic_kernels_are_asked_of_torch_as_lightnings_trainer_does(monkeypatch):
    """trainer.deterministic (Lightning's Trainer setting; this loop refused it): torch's deterministic kernels."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        deterministic_kernels(True)
        assert (
            torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
        )
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # (cuBLAS's, which its kernels need on a GPU)
        deterministic_kernels("warn")
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        deterministic_kernels(False)
    assert not torch.are_deterministic_algorithms_enabled()
