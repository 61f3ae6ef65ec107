"""Every preset composes and builds a Trainer; bad input fails early, in one line, leaving nothing behind."""

from pathlib import Path

import pytest
import torch
from conftest import COMMAND_LINE_REFUSALS_BY_ID, unsplit_net
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import open_dict

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.config.objects import register_resolvers
from {{ cookiecutter.package_name }}.config.overrides import check_overrides
from {{ cookiecutter.package_name }}.engine.training import check_checkpoint_path
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.runtime.precision import resolve_precision

MODEL_PARALLEL = ["strategy=model_parallel", "trainer.accelerator=cpu"]
PRESETS = sorted(path.stem for path in (CONFIG_DIR / "strategy").glob("*.yaml"))


def compose_config(tmp_path: Path, *overrides: str):
    """The config train.py would get, with Hydra's runtime output dir pointed at tmp_path."""
    register_resolvers()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    cfg.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg.hydra
    return cfg


def test_every_preset_is_documented():
    assert {"single", "ddp", "ddp_spawn", "dp", "model_parallel"} <= set(PRESETS)
    for preset in PRESETS:
        header = (CONFIG_DIR / "strategy" / f"{preset}.yaml").read_text()
        assert f"# {preset}:" in header, f"{preset}.yaml lacks its 'what it is for' line"
        assert "# Hardware:" in header and "# Launch:" in header, f"{preset}.yaml lacks hardware/launch lines"


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_builds_a_trainer(tmp_path, preset):
    devices = 1 if preset == "single" else 2
    cfg = compose_config(tmp_path, f"strategy={preset}", "trainer.accelerator=cpu", f"trainer.devices={devices}")
    precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)  # train.py resolves "auto"
    trainer = instantiate(cfg.trainer, strategy=cfg.strategy, logger=False, precision=precision)
    assert trainer.num_devices == (1 if preset == "dp" else devices), "dp runs on one device without 2 GPUs"


def test_overrides_reach_the_objects(tmp_path):
    cfg = compose_config(
        tmp_path,
        "data.batch_size=64",
        "data.shuffle=false",
        "seed=7",
        "trainer.max_steps=3",
        "+callbacks.lr._target_=lightning.pytorch.callbacks.LearningRateMonitor",
        "logger=none",
    )
    assert instantiate(cfg.data).batch_size == 64
    assert instantiate(cfg.data).data.shuffle is False and cfg.data.seed == 7
    assert instantiate(cfg.trainer, strategy=cfg.strategy, precision="32-true").max_steps == 3
    assert type(instantiate(cfg.callbacks.lr)).__name__ == "LearningRateMonitor"
    assert not cfg.logger, "logger=none composes to an empty node: no logger"
    assert cfg.callbacks.checkpoint.dirpath == f"{tmp_path}/checkpoints"


@pytest.mark.parametrize("monitor", ["checkpoint.monitor=val/acc", "callbacks.checkpoint.monitor=val/acc"])
def test_the_best_checkpoint_of_accuracy_is_its_highest(tmp_path, monitor):
    """The shared setting, or Lightning's own (the callback's): mode follows the metric (min left the worst)."""
    checkpoint = instantiate(compose_config(tmp_path, monitor).callbacks.checkpoint)
    assert (checkpoint.monitor, checkpoint.mode) == ("val/acc", "max")
    assert instantiate(compose_config(tmp_path).callbacks.checkpoint).mode == "min"


# (overrides, the one error line); each refused before training (conftest's `refused` runs them)
BAD_INPUT_BY_ID = {
    "unknown-strategy": (["strategy=warp_drive"], "unknown strategy 'warp_drive'; valid: " + ", ".join(PRESETS)),
    "unknown-logger": (  # (the presets there: a logger preset of yours is one of them)
        ["logger=tensorboardx"],
        "unknown logger 'tensorboardx'; valid: "
        + ", ".join(sorted(p.stem for p in (CONFIG_DIR / "logger").glob("*.yaml"))),
    ),
    "validation-every-0-epochs": (  # (a ZeroDivisionError at the first epoch's end, its run folder written)
        ["trainer.check_val_every_n_epoch=0"],
        "trainer.check_val_every_n_epoch=0 must be a whole number >= 1, or null",
    ),
    "indivisible-batch": (
        ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "data.batch_size=255"],
        "data.batch_size=255 is the global batch and must be a positive multiple of the 2 data-parallel replicas",
    ),
    "missing-checkpoint": (["ckpt_path=missing.ckpt"], "ckpt_path=missing.ckpt does not exist"),
    "checkpoint-that-is-a-source-file": (
        [f"ckpt_path={Path(__file__)}"],
        f"ckpt_path={Path(__file__)} is not a checkpoint (a .ckpt file, or the",
    ),
    "checkpoint-that-is-a-folder-of-other-files": (
        [f"ckpt_path={Path(__file__).parent}"],
        f"ckpt_path={Path(__file__).parent} is not a checkpoint",
    ),
    "run-folder-under-a-file": (
        [f"hydra.run.dir={Path(__file__)}/run"],
        f"the run folder {Path(__file__)}/run cannot be made: {Path(__file__)} is",
    ),
    "single-on-two-devices": (
        ["strategy=single", "trainer.accelerator=cpu", "trainer.devices=2"],
        "use strategy=ddp for several",
    ),
    "dp-on-two-nodes": (["strategy=dp", "trainer.num_nodes=2"], "strategy=dp runs one process on one node"),
    "mesh-not-world-size": (
        [*MODEL_PARALLEL, "trainer.devices=2", "strategy.tensor_parallel_size=4"],
        "strategy.data_parallel_size=1 x strategy.tensor_parallel_size=4 must equal the processes: "
        "trainer.devices=2 x trainer.num_nodes=1 = 2",
    ),
    "hidden-not-divisible": (
        [*MODEL_PARALLEL, "trainer.devices=3"],
        "blocks.0.fc_in has 512 output features, which strategy.tensor_parallel_size=3 does not divide; valid with "
        "the 3 processes: 1 (the model allows 1, 2, 4, 8, 16, 32, ... (the divisors of 512))",
    ),
    "gpt-heads-not-divisible": (
        [*MODEL_PARALLEL, "trainer.devices=4", "model=gpt", "model.net.num_heads=2"],
        # (valid: what divides the heads too; a refusal named the 64 features of a projection, then the heads)
        "blocks.0.attn has 2 attention heads, which strategy.tensor_parallel_size=4 does not divide; valid: 1, 2,",
    ),
    "unknown-mode": (
        [*MODEL_PARALLEL, "strategy.mode=pipes"],
        "strategy.mode='pipes' is unknown; valid: tensor, layers",
    ),
    "finder-under-dp": (
        ["strategy=dp", "oom.find_batch_size=true"],
        "oom.find_batch_size works under strategy=single|ddp|ddp_spawn, not strategy=dp (its trials would run on the "
        "first GPU alone and size the global batch by it); turn it off with oom.find_batch_size=false",
    ),
    "pipeline-without-split": (
        ["strategy=pipeline", "trainer.accelerator=cpu", *unsplit_net()],
        "strategy=pipeline needs to know how to split Sequential: add register_split(Sequential, Split(",
    ),
    "model-parallel-without-split": (
        [*MODEL_PARALLEL, "trainer.devices=2", *unsplit_net()],
        "strategy=model_parallel needs to know how to split Sequential: add register_split(Sequential, Split(",
    ),
    "dataset-that-does-not-import": (
        ["data.dataset._target_=nope.Nope"],
        "data.dataset._target_=nope.Nope cannot be imported (No module named 'nope'); give the full import path",
    ),
    # its validation, and the best checkpoint saved there, would land inside an optimizer step
    "validation-inside-an-optimizer-step": (
        ["trainer.accumulate_grad_batches=2", "trainer.val_check_interval=3", "data.batch_size=64"],
        "trainer.val_check_interval=3 counts micro-batches: give a multiple of trainer.accumulate_grad_batches=2",
    ),
    # a forward that adds a position vector after `embed`: the pipeline's chain would train another model
    "pipeline-of-a-forward-that-is-not-its-chain": (
        ["strategy=pipeline", "trainer.accelerator=cpu", "model.net._target_=own_models.PositionSummed"],
        "runs PositionSummed's Split as a chain (first, blocks, last, each on the one before's output), but its "
        "forward gives it something else than embed's output for blocks.0: it would train another model",
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
    "fsdp-replicas-not-dividing": (
        ["strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "strategy.replicas=3"],
        "strategy.replicas=3 must divide the 2 processes: HSDP shards the model within 2 / replicas processes",
    ),
    "pipelines-not-dividing-the-processes": (
        [
            *("strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2"),
            "strategy.data_parallel_size=3",
            "data.batch_size=192",
        ],  # fmt: skip
        "strategy.data_parallel_size=3 must divide the 2 processes (pipelines x stages); valid: 1, 2",
    ),
    # what the process count decides, from the command line (its logic on both engines: test_pipelining.py)
    "interleaved-microbatches-in-unequal-rounds": (
        [
            *("strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2"),
            "strategy.schedule=interleaved_1f1b",
            "strategy.microbatches=5",
            "data.batch_size=250",
        ],
        "strategy.microbatches=5 does not fit strategy.schedule=interleaved_1f1b over 2 processes per pipeline (torch "
        "runs them in 5 // 2 = 2 equal rounds); valid: 2, 3, 4, 6, 8, ...",
    ),  # fmt: skip
    "more-stages-than-blocks": (  # 2 processes x 3 stages: the net's 4 blocks cannot make 6 stages
        [
            *("strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2"),
            "strategy.schedule=interleaved_1f1b",
            "strategy.stages_per_process=3",
        ],
        "strategy=pipeline: 6 pipeline stages need at least 6 blocks; the model has 4 (2 processes x "
        "strategy.stages_per_process=3)",
    ),  # fmt: skip
    # a package Lightning asks for (torch_xla) was a multi-line report of Hydra's
    "accelerator-whose-package-is-missing": (
        ["trainer.accelerator=tpu"],
        "Trainer: Requirement 'torch_xla",
    ),
    # a module of yours (+model._target_): these three were tracebacks, with a run folder left behind
    "module-that-does-not-import": (
        ["+model._target_=oom_sim.OOMClasifier"],
        "model._target_=oom_sim.OOMClasifier does not import (",
    ),
    "module-that-is-not-a-classifier": (
        ["+model._target_=torch.nn.Linear"],
        "model._target_=torch.nn.Linear is not a subclass of engine.module.Classifier",
    ),
    "module-argument-it-does-not-take": (
        ["+model._target_=oom_sim.OOMClassifier", "+model.colour=red"],
        "model.colour: OOMClassifier takes model.net, model.optimizer, model.no_decay_norms_and_biases and its own: "
        "oom_above,",
    ),
    # what its training_step logged went missing in silence: the pipeline runs the step itself
    "pipeline-of-a-modules-own-training-step": (
        ["strategy=pipeline", "trainer.accelerator=cpu", "+model._target_=own_modules.StepLogging"],
        "strategy=pipeline runs each step itself, not StepLogging.training_step (of +model._target_): log a metric of",
    ),
    "oom-toolkit-as-callbacks": (  # a Lightning user's guess: the OOM toolkit as callbacks
        ["callbacks=[oom,batch_size_finder]"],
        "unknown callbacks 'oom'; valid: checkpoint, default, none, progress_bar; the OOM toolkit is oom=toolkit",
    ),
    "callback-that-is-not-a-node": (
        ["+callbacks.stop=1"],
        "+callbacks.stop: a callback is a node that names its class: +callbacks.stop._target_=",
    ),
    "accelerate-data-class": (  # the Accelerate engine's data class: a traceback, and a run folder left behind
        ["data._target_={{ cookiecutter.package_name }}.data.loading.Data"],
        "data._target_={{ cookiecutter.package_name }}.data.loading.Data is not this engine's data module: give ",
    ),
    # (Accelerate: by its launch only; test_model_split.py checks the plan's values in both)
    "tensor-parallel-plan-that-changes-the-values": (
        ["strategy=model_parallel", "trainer.accelerator=cpu", "trainer.devices=2"]
        + ["model.net._target_=own_models.NormalizedHidden"],
        "the tensor-parallel plan of NormalizedHidden changes what it computes: over 2 ranks, its output on one sample",
    ),
    # each stage's blocks sharded by the same plan: it trained, with other losses than one device's
    "the-same-plan-in-pipeline-stages": (
        ["strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=4", "strategy.tensor_parallel_size=2"]
        + ["model.net._target_=own_models.NormalizedHidden"],
        "the tensor-parallel plan of NormalizedHidden changes what it computes: over 2 ranks, its output on one sample",
    ),
    "overfit-batches": (  # an AttributeError at the first checkpoint (its SequentialSampler has no epoch)
        ["+trainer.overfit_batches=2"],
        "trainer.overfit_batches replaces the training's sampler (the global batch over the processes, resumable",
    ),
    "validation-every-0-batches": (
        ["trainer.val_check_interval=0"],
        "trainer.val_check_interval=0 must be a number of training batches (1 or mo",
    ),
    # Lightning's ValueError once fit had started: a traceback, and a run folder with a wandb run in it
    "validation-past-the-epoch": (
        ["trainer.val_check_interval=1000"],
        "trainer.val_check_interval=1000 is past the end of an epoch of 32 training batches: give 1 to 32, or "
        "trainer.check_val_every_n_epoch=null",
    ),
    "learning-rate-monitor-without-logger": (  # (the same, a MisconfigurationException, once fit had started)
        ["logger=none", "+callbacks.lr._target_=lightning.pytorch.callbacks.LearningRateMonitor"],
        "callbacks.lr (LearningRateMonitor) logs to the logger, and logger=none gives none: give logger=wandb, or",
    ),
    # multiprocessing's traceback at the start of fit, after the run folder and its wandb run
    "spawn-of-a-net-it-cannot-pickle": (
        ["strategy=ddp_spawn", "trainer.accelerator=cpu", "trainer.devices=2"]
        + ["model.net._target_=own_models.WithLambda"],
        "strategy=ddp_spawn pickles the training to send it to the processes it starts, and model.net "
        "(own_models.WithLambda) cannot be pickled (Can't pickle local object 'WithLambda.__init__.<locals>.<lambda>')",
    ),
    **COMMAND_LINE_REFUSALS_BY_ID,  # (conftest: the same in both engines)
}
BAD_INPUT, BAD_INPUT_IDS = list(BAD_INPUT_BY_ID.values()), list(BAD_INPUT_BY_ID)  # (ids beside their rows)


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=BAD_INPUT_IDS)
def test_bad_input_fails_in_one_line(refused, case):
    refused[case].assert_rejected(BAD_INPUT[case][1])


@pytest.mark.parametrize(
    "monitor",
    [
        ["callbacks.checkpoint.monitor=val/accc"],  # a MisconfigurationException; EarlyStopping's, a RuntimeError
        ["+callbacks.stop._target_=lightning.pytorch.callbacks.EarlyStopping", "+callbacks.stop.monitor=val/accc"],
    ],
    ids=["checkpoint", "early-stopping"],
)
def test_a_mistake_lightning_finds_during_fit_is_one_line_too(train, monitor):
    run = train(
        "strategy=single",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        *monitor,
        "trainer.enable_progress_bar=false",
        "logger=none",
        check=False,
    )
    assert run.returncode == 2
    assert "Traceback" not in run.output
    [error] = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert "val/accc" in error and "val/acc" in error.replace("val/accc", "")


def test_a_second_callbacks_preset_is_added_under_a_package_of_its_own():
    """+callbacks@callbacks.NAME=PRESET adds a preset's callbacks beside the chosen ones (Hydra's package syntax); a
    plain +callbacks=PRESET is refused (a preset of callbacks is chosen already)."""
    check_overrides(["+callbacks@callbacks.extra=progress_bar"], "train")
    with pytest.raises(ConfigError, match="a preset of callbacks is chosen already"):
        check_overrides(["+callbacks=progress_bar"], "train")


def test_keys_added_to_the_logger_and_callbacks_are_refused_only_where_nothing_reads_them():
    """(The refusals are in BAD_INPUT.) What the checks of +logger.KEY and +callbacks.NAME must let through: a
    callback given whole as a node, another logger class's own arguments, wandb.init's and WandbLogger's."""
    early_stop = "{_target_:lightning.pytorch.callbacks.EarlyStopping,monitor:val/loss}"
    check_overrides(
        [f"+callbacks.stop={early_stop}", "+callbacks.late._target_=lightning.pytorch.callbacks.Timer"], "train"
    )
    check_overrides(
        ["logger._target_=lightning.pytorch.loggers.CSVLogger", "+logger.flush_logs_every_n_steps=5"], "train"
    )
    check_overrides(["+logger.tags=[a,b]", "+logger.notes=first", "+logger.prefix=run"], "train")


def test_weights_alone_are_refused_as_a_checkpoint_to_continue(tmp_path):
    """ckpt_path= a state_dict (pretrained weights, say) was taken for a checkpoint, then Lightning failed in a
    44-line traceback (KeyError 'pytorch-lightning_version'); a checkpoint Lightning wrote passes."""
    weights = tmp_path / "pretrained.pt"
    torch.save(ResidualMLP(in_features=4, num_classes=2, hidden=8, depth=1).state_dict(), weights)
    with pytest.raises(ConfigError, match=f"ckpt_path={weights} is not a training checkpoint .* 'Pretrained weights'"):
        check_checkpoint_path(weights)
    check_checkpoint_path(Path(__file__).parent / "old_layout_run" / "checkpoints" / "last.ckpt")
