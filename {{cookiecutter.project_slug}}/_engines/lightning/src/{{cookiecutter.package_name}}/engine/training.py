"""The Lightning engine's training: config -> data -> model -> callbacks -> logger -> trainer -> fit -> test.

Every object is built from configs/ by Hydra, so the lines below read the same whatever the strategy, but for
what a preset's checks and checkpoints need. The
command, `python -m {{ cookiecutter.package_name }}.train`, calls train() and reports a refusal in one line.
"""

import functools
import os
import signal
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import DeviceStatsMonitor, LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from torch.multiprocessing.spawn import ProcessRaisedException

from ..config.objects import build_object
from ..data.batch_sizes import batches_per_epoch, check_epoch_batches, check_limit, per_device_batch_size
from ..data.checks import (
    check_evaluation_batches,
    check_input,
    check_output,
    first_input,
    first_sample,
    targets_are_values,
)
from ..data.sampling import check_position
from ..errors import EXIT_INTERRUPTED, ConfigError, Interrupted, said_once, spawned_failure, unused_parameters
from ..models.activation_checkpointing import check_activation_checkpointing
from ..models.float8 import check_float8, check_float8_layers
from ..parallel.batchnorm import accumulation_note, needs_sync, synchronised_message, unsynchronised_note
from ..parallel.launcher import (
    check_srun_tasks_joined,
    detect_launcher,
    die_with_launcher,
    fit_layout_to_launcher,
    is_first_process,
    warn_if_restarts_can_hang,
)
from ..parallel.plan_values import check_plan_values
from ..parallel.presets import built_in_preset
from ..parallel.sharding import check_layer_devices, check_sized_parameters
from ..parallel.split import check_chain
from ..runtime.async_saves import check_async
from ..runtime.checkpoint_files import last_of_run_folder, pickled_keys_include
from ..runtime.hardware import check_device_settings
from ..runtime.interrupt import interrupted, mark_finished
from ..runtime.memory import configure_allocator
from ..runtime.metrics import check_monitor
from ..runtime.optimization import check_optimization
from ..runtime.precision import resolve_precision
from ..runtime.resuming import (
    check_not_past_the_end,
    check_same_mesh,
    check_same_shapes,
    check_saved_run,
    starting_point,
)
from ..runtime.run_folder import record_start
from ..tracking.wandb_run import finish_wandb, wandb_mode, write_atomically
from .callbacks.batch_size_finder import BatchSizeFinder
from .callbacks.epoch_metrics import EpochMetricsFile
from .callbacks.oom_toolkit import oom_callbacks
from .checkpoints import (
    LAST,
    AnyPresetCheckpointIO,
    ResumeCheckpoint,
    loadable_form,
    mid_epoch_position,
    prepare_run_folder,
    resume_from,
    saved_state,
    trained_so_far,
)
from .datamodule import DataModule
from .lightning_private import launch_this_job
from .module import build_module
from .profiler import NoProfiler
from .strategies import (
    BatchNormSync,
    check_layout,
    check_validation_in_epoch,
    data_parallel_size,
    device_layout,
    model_init_context,
)
from .strategies.spawn import check_picklable

# Lightning reports a bad Trainer argument as MisconfigurationException: a refused config too.
build = functools.partial(build_object, bad_arguments=(MisconfigurationException,))


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and test as configured; returns the final metrics. Raises ConfigError before training, and for what
    Lightning finds wrong once fit starts (e.g. an unknown monitor key) or a ddp_spawn process reports."""
    try:
        return fit_and_test(cfg)
    except MisconfigurationException as err:
        raise ConfigError(str(err)) from err
    except ProcessRaisedException as err:  # strategy=ddp_spawn: a spawned process failed; its traceback is the text
        raise spawned_failure(err.error_index, str(err), config_errors=(MisconfigurationException,)) from err
    except RuntimeError as err:
        if str(err).startswith("Early stopping conditioned on metric"):  # a monitor no metric has (a typo, say)
            raise said_once(ConfigError(str(err)), rank_zero_only.rank == 0) from err
        raise


def fit_and_test(cfg: DictConfig) -> dict[str, float]:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    configure_allocator()  # before anything initialises CUDA
    launch_this_job()  # (a --multirun: ddp's other processes for this job, not the whole sweep in each)
    # A restart continues from the run's last checkpoint; checkpoints of another training are refused.
    cfg.ckpt_path, cfg.resume = starting_point(run_dir, cfg, run_dir / "checkpoints" / LAST)
    trainer, model, datamodule = prepare(cfg)  # checked before anything is written or deleted
    start = resume_from(run_dir, cfg.ckpt_path, cfg.resume)
    saved = saved_state(start) if start else {}  # read once: its counters and its loader's position
    if start:  # a global batch that continues the epoch a whole step ahead? (Lightning would find out after wandb)
        finder = any(isinstance(callback, BatchSizeFinder) for callback in trainer.callbacks)
        position = mid_epoch_position(saved, finder)
        check_position(position, cfg.data.batch_size, data_parallel_size(trainer), cfg.data.num_workers)
    if start and (done := trained_so_far(saved)):
        limits = cfg.trainer.max_epochs, cfg.trainer.max_steps
        if note := check_not_past_the_end(Path(start), *done, *limits, bool(cfg.ckpt_path), cfg.test_after_fit):
            rank_zero_info(note)
    tensor_parallel = getattr(trainer.strategy, "tensor_parallel_size", 1)  # another one than the checkpoint's?
    given = bool(cfg.ckpt_path)
    check_same_mesh(Path(start) if start else None, data_parallel_size(trainer), tensor_parallel, preset(cfg), given)
    if synchronised_batchnorm(cfg, model, trainer):
        rank_zero_info(synchronised_message(trainer.world_size))  # converted when fit starts (BatchNormSync)
    if cfg.check_only:
        counted = f"{trainer.world_size} process{'es' if trainer.world_size > 1 else ''}"
        chosen = HydraConfig.get().runtime.choices["strategy"]  # (a preset of yours by its name)
        print(f"check_only: the command passes its checks (strategy={chosen}, {counted}); nothing was trained")
        return {}

    prepare_run_folder(run_dir, cfg.ckpt_path, cfg.resume)
    # After it: the logger continues the run's wandb run, which resume=false has just forgotten. fast_dev_run
    # (Lightning's smoke test of a few batches) keeps the Trainer's DummyLogger: it logs nothing, as Lightning says.
    if not trainer.fast_dev_run:
        trainer.loggers = [build(cfg.logger)] if cfg.logger else []
    failed = True
    try:
        if trainer.is_global_zero:
            write_atomically(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))  # others may read it
            mark_finished(run_dir, False)
            record_start(run_dir, start)  # (starts.jsonl: each start's settings, versions and git commit)
            for logger in trainer.loggers:  # the resolved config and the run's layout, rank 0 only
                logger.log_hyperparams(run_summary(cfg, trainer))
        try:
            trainer.fit(model, datamodule=datamodule, ckpt_path=start)
        except (RuntimeError, ProcessRaisedException) as err:  # DDP's, for a parameter a step did not use: in one line
            if refusal := unused_parameters(str(err), preset(cfg), unused=without_gradient(model)):
                raise said_once(refusal, trainer.is_global_zero) from err
            raise
        resume = next((callback for callback in trainer.callbacks if isinstance(callback, ResumeCheckpoint)), None)
        if resume and resume.interrupted_at is not None:  # Ctrl-C: saved, stopped; say how to continue
            failed = False
            last = run_dir / "checkpoints" / LAST
            if not trainer.is_global_zero:  # (Lightning's own processes: 0, see Interrupted)
                raise Interrupted("", code=EXIT_INTERRUPTED if detect_launcher() else 0)
            raise interrupted(resume.interrupted_at, last, cfg.run_id)
        if preset(cfg) == "ddp_spawn" and (run_dir / "checkpoints" / LAST).is_file():  # (a folder: another preset's)
            restore_loop_counters(trainer, run_dir / "checkpoints" / LAST)
        if cfg.test_after_fit and "test" in datamodule.data.split_names:  # data=files: test is optional
            best = best_of_this_run(trainer, run_dir)
            trainer.test(model, datamodule=datamodule, ckpt_path=best)  # ("best" warns: there are 2 ModelCheckpoints)
        failed = False
        if trainer.is_global_zero:
            mark_finished(run_dir, True)  # run_id=last continues unfinished runs only
    except SystemExit as stop:  # Lightning's answer to a Ctrl-C (or SIGTERM) outside the steps ResumeCheckpoint's
        if not (isinstance(stop.__context__, KeyboardInterrupt) or isinstance(stop, SIGTERMException)):
            raise  # (answer: exit 1, or 0 having trained nothing, without a word; now as any Ctrl-C at once)
        if trainer.strategy.launcher is not None:  # ddp_spawn's processes, which Lightning leaves training
            trainer.strategy.launcher.kill(signal.SIGKILL)
        if not trainer.is_global_zero:  # (Lightning's own processes: 0, see Interrupted; the first one says it)
            raise Interrupted("", code=EXIT_INTERRUPTED if detect_launcher() else 0) from None
        raise KeyboardInterrupt from None
    finally:
        finish_wandb(failed)
    return {name: float(value) for name, value in trainer.callback_metrics.items()}


def best_of_this_run(trainer: L.Trainer, run_dir: Path) -> str | None:
    """The best checkpoint this run saved, which the test pass loads; None (the weights as they are) where it saved
    none. (Lightning restores the best path of a checkpoint given as ckpt_path: another run's file, deleted since by
    its keep_last, or another checkpoint than the one given.)"""
    best = trainer.checkpoint_callback and trainer.checkpoint_callback.best_model_path
    ours = best and Path(best).parent == run_dir / "checkpoints" and Path(best).exists()
    return best if ours else None


def without_gradient(model: L.LightningModule) -> list[str]:
    """The trained parameters that no step has given a gradient, when DDP stops at the second step for them
    (Lightning's message replaces torch's, which listed them): the step before left the others theirs. None found
    where no parameter has one (ddp_spawn's trained in other processes)."""
    trained = [(name.removeprefix("net."), p) for name, p in model.named_parameters() if p.requires_grad]
    unused = [name for name, p in trained if p.grad is None]
    return unused if len(unused) < len(trained) else []


def restore_loop_counters(trainer: L.Trainer, checkpoint: Path) -> None:
    """strategy=ddp_spawn trained in processes of its own, whose loop counters (steps, epochs) this process's trainer
    never saw: the test would be logged at step 0, epoch 0. They are read back from the last checkpoint, saved
    inside the last epoch: counted as done, as the fit that went on past the save counted it (single logs its test at
    epoch max_epochs, this one logged it an epoch earlier)."""
    trainer.fit_loop.load_state_dict(saved_state(checkpoint)["loops"]["fit_loop"])
    epochs = trainer.fit_loop.epoch_progress.current
    epochs.processed = epochs.completed = epochs.ready


def prepare(cfg: DictConfig) -> tuple[L.Trainer, L.LightningModule, L.LightningDataModule]:
    """The trainer, model and data of this config, checked: everything that can refuse the config does so
    here, before a process starts or a file is written (raises ConfigError). The search runs it on the config of
    its first trial, so that a config every trial would refuse is refused before the first. Without a logger: see
    fit_and_test."""
    if cfg.ckpt_path:
        cfg.ckpt_path = str(
            last_of_run_folder(Path(cfg.ckpt_path), LAST)
        )  # (train.py took it already; the search not yet)
        check_checkpoint_path(Path(cfg.ckpt_path))
    if cfg.trainer.get("overfit_batches"):  # Lightning swaps in a sampler that neither deals batches out nor resumes
        raise ConfigError(
            "trainer.overfit_batches replaces the training's sampler (the global batch over the processes, resumable "
            "mid-epoch); to overfit N batches: trainer.limit_train_batches=N trainer.limit_val_batches=N "
            "data.shuffle=false"
        )
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # (the seed is in the config it logs)
    if cfg.trainer.max_steps is None:  # "no limit" as the docs say (-1 or null); Lightning takes -1 only
        cfg.trainer.max_steps = -1
    check_monitor(cfg.checkpoint.monitor)  # (the name; the targets' kind once the data is built)
    for limit in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        check_limit(limit, cfg.trainer.get(limit))
    if cfg.logger:
        wandb_mode()  # a WANDB_MODE wandb would refuse, now

    check_optimization(
        cfg, build(cfg.model.optimizer), build(cfg.scheduler)
    )  # before the callbacks, which take some of its settings
    datamodule = build(cfg.data)
    if not isinstance(datamodule, DataModule):  # e.g. a data preset of an Accelerate project: data.loading.Data
        raise ConfigError(
            f"data._target_={cfg.data._target_} is not this engine's data module: give "
            f"{DataModule.__module__}.DataModule, the _target_ of configs/data/*.yaml"
        )
    callbacks = build_callbacks(cfg)
    # Under torchrun or SLURM the launcher's layout, unless the command line gave one (checked against it).
    num_nodes, devices = fit_layout_to_launcher(
        preset(cfg), cfg.trainer.num_nodes, cfg.trainer.devices, HydraConfig.get().overrides.task
    )
    warn_if_restarts_can_hang()
    die_with_launcher()  # an orphan of a dead torchrun agent trained on
    check_device_settings(cfg.trainer.accelerator, devices, gpu_indices=True)  # (Lightning's words named neither)
    cfg.trainer.precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)  # auto: bf16 on GPUs
    plugins = build_plugins(cfg)
    trainer = build(
        cfg.trainer,
        num_nodes=num_nodes,
        devices=devices,
        strategy=cfg.strategy,
        callbacks=callbacks,
        logger=False,  # fit_and_test gives it, once the run folder is ready for it
        plugins=plugins or None,
        profiler=cfg.trainer.profiler or NoProfiler(),
    )
    with model_init_context(trainer):  # model_parallel: on the meta device, each rank allocates its shards
        model = build_module(
            cfg.model,
            scheduler=build(cfg.scheduler),
            compile=cfg.compile,
            tf32=cfg.tf32,
            activation_checkpointing=cfg.activation_checkpointing,
            float8=cfg.float8,
        )
    check_model_and_data(cfg, trainer, model, datamodule)
    return trainer, model, datamodule


def build_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """configs/callbacks/ and the OOM toolkit's (configs/oom/), each told its setting and how to turn it off, and the
    ones the run's settings add or leave out: the checkpoint the run resumes from (unless
    trainer.enable_checkpointing=false), the epoch metrics file."""
    callbacks, resume_at = [], 0
    for name, config in (cfg.callbacks or {}).items():
        callbacks.append(callback := build(config))
        if callback is not None:  # what a refusal names, and tells to drop
            callback.setting, callback.turn_off = f"callbacks.{name}", f"~callbacks.{name}"
        if name == "checkpoint":  # (Lightning runs checkpoint callbacks last, in their order: the best one first)
            resume_at = len(callbacks)
    callbacks += oom_callbacks(cfg.oom)
    if not cfg.trainer.enable_checkpointing:  # (Lightning refuses a checkpoint callback with it)
        callbacks = [callback for callback in callbacks if not isinstance(callback, ModelCheckpoint)]
    else:  # not a callback of the config, which callbacks=none dropped, and with it every restart's resuming
        # (select: the search checks a trial's config, whose run folder is not named yet, as ${hydra:...} does)
        checkpoints = Path(OmegaConf.select(HydraConfig.get(), "runtime.output_dir") or ".") / "checkpoints"
        resume = ResumeCheckpoint(str(checkpoints), cfg.checkpoint.every_n_steps, cfg.checkpoint.keep_last)
        callbacks.insert(resume_at, resume)  # before the ones the command line adds (+callbacks.X)
    for callback in callbacks if not cfg.logger else []:  # (Lightning finds out once fit has started)
        if isinstance(callback, (LearningRateMonitor, DeviceStatsMonitor)):
            raise ConfigError(
                f"{callback.setting} ({type(callback).__name__}) logs to the logger, and logger=none gives none: "
                f"give logger=wandb, or drop it with {callback.turn_off}"
            )
    if not cfg.trainer.enable_progress_bar:  # one switch hides the bar, whichever bar callback is configured
        callbacks = [callback for callback in callbacks if not isinstance(callback, ProgressBar)]
    if cfg.epoch_metrics:  # the search reads it to prune a trial
        callbacks.append(EpochMetricsFile(cfg.epoch_metrics))
    return callbacks


def build_plugins(cfg: DictConfig) -> list[Any]:
    """The user's trainer.plugins, and the ones every run needs that the user did not give."""
    plugins = [build(plugin) for plugin in cfg.trainer.get("plugins") or []]  # the user's, e.g. a CheckpointIO
    if not any(isinstance(plugin, CheckpointIO) for plugin in plugins) and not has_checkpoint_io(cfg.strategy):
        plugins.append(AnyPresetCheckpointIO())  # reads a checkpoint of any preset (the presets that split it: theirs)
    if cfg.trainer.sync_batchnorm:
        plugins.append(BatchNormSync())  # on CPU processes too
    if SLURMEnvironment.detect() and not any(isinstance(plugin, ClusterEnvironment) for plugin in plugins):
        # Lightning's auto-requeue saves a checkpoint in its SIGUSR1 handler, wherever the signal lands: with the
        # other processes inside the step's gradient all-reduce, the save's collectives waited for ever (a job
        # deadlocked until its time limit). launch/slurm.sbatch requeues the job itself, and its tasks ignore USR1.
        try:
            plugins.append(SLURMEnvironment(auto_requeue=False))
        except RuntimeError as err:  # srun -n N without --ntasks-per-node: Lightning's hint, in one line
            raise ConfigError(str(err).replace("\n", " ")) from err
    return plugins


def check_model_and_data(
    cfg: DictConfig, trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule
) -> None:
    """Everything that can refuse the built trainer, model and data together, and the notes about them."""
    slurm = isinstance(getattr(trainer.strategy, "cluster_environment", None), SLURMEnvironment)
    check_srun_tasks_joined("TORCHELASTIC_RUN_ID" in os.environ or (slurm and trainer.world_size > 1))
    check_sized_parameters(model.net, preset(cfg))  # (before the presets' own checks, which read the sizes)
    if cfg.ckpt_path:  # another net's tensors? (a checkpoint away from its run folder: no config.yaml says)
        check_same_shapes(Path(cfg.ckpt_path), model.net)
    if (note := accumulation_note(model.net, cfg.trainer.accumulate_grad_batches)) and is_first_process():
        print(note, file=sys.stderr)
    unsynchronised = preset(cfg) in ("ddp", "ddp_spawn") and not cfg.trainer.sync_batchnorm
    if unsynchronised and (note := unsynchronised_note(model.net, data_parallel_size(trainer))) and is_first_process():
        print(note, file=sys.stderr)
    check_activation_checkpointing(model.net, cfg.activation_checkpointing)
    tensor_parallel = getattr(trainer.strategy, "tensor_parallel_size", 1)
    check_float8(cfg.float8, preset(cfg), cfg.trainer.accelerator, tensor_parallel)
    writer = getattr(trainer.strategy, "checkpoint_writer", None)  # the presets whose processes each write a part
    check_async(cfg.checkpoint.get("async", False), preset(cfg), writer is not None)
    if writer is not None:
        writer.background = cfg.checkpoint.get("async", False)
    check_float8_layers(model.net, cfg.float8)
    synchronised = synchronised_batchnorm(cfg, model, trainer)
    check_layout(preset(cfg), trainer, cfg.data.batch_size, model, synchronised)  # now, not inside a worker process
    datamodule.data.check_replicas(data_parallel_size(trainer), trainer.world_size)
    if isinstance(trainer.val_check_interval, int) or trainer.limit_train_batches != 1.0:  # (a loader's length)
        loader = datamodule.data.loader(
            "train", data_parallel_size(trainer), accumulate=trainer.accumulate_grad_batches
        )
        batches = batches_per_epoch(len(loader), trainer.limit_train_batches)
        check_epoch_batches(trainer.limit_train_batches, batches, trainer.accumulate_grad_batches)
        check_validation_in_epoch(trainer, batches)
    evaluated = {"val": trainer.limit_val_batches, "test": trainer.limit_test_batches if cfg.test_after_fit else None}
    check_evaluation_batches(datamodule.data, data_parallel_size(trainer), evaluated)
    check_input(model.net, datamodule.data, cfg.trainer.precision.endswith("-mixed"))  # e.g. uint8 images
    check_monitor(cfg.checkpoint.monitor, targets_are_values(datamodule.data))
    with torch.device("meta"):  # what the loss can take, for the data's targets: a forward on shapes alone
        shapes_only = build(cfg.model.net)
    micro = per_device_batch_size(cfg.data.batch_size, data_parallel_size(trainer), trainer.accumulate_grad_batches)
    # the module's loss (of yours, if you change it)
    check_output(shapes_only, datamodule.data, model.loss, micro, synchronised=synchronised)
    if preset(cfg) == "pipeline":  # the stages run the Split's chain, not the model's forward: the same model?
        check_chain(model.net, first_sample(datamodule.data))
    if preset(cfg) == "model_parallel" and cfg.strategy.mode == "layers":  # a skip connection across the devices?
        check_layer_devices(model.net, first_input(datamodule.data), len(trainer.strategy.devices))
    if tensor_parallel > 1:  # (model_parallel, pipeline) a plan that changes what the net computes?
        check_plan_values(lambda: build(cfg.model.net), first_sample(datamodule.data), tensor_parallel)
    if preset(cfg) == "ddp_spawn":  # its processes receive the training pickled: can they?
        dataset = (cfg.data.get("dataset") or {}).get("_target_") or cfg.data._target_
        parts = {f"model.net ({cfg.model.net._target_})": model.net, f"data ({dataset})": datamodule, "model": model}
        check_picklable(parts | {getattr(c, "setting", type(c).__name__): c for c in trainer.callbacks})


def check_checkpoint_path(path: Path) -> None:
    """A checkpoint Lightning can load: a file torch.save wrote, or the folder of a preset that writes parts
    (fsdp, model_parallel, pipeline: DCP's, with its .metadata)."""
    if not path.exists():
        raise ConfigError(
            f"ckpt_path={path} does not exist; give a .ckpt file (e.g. a run's last.ckpt) or a run folder"
        )
    check_saved_run(path, LAST)
    if not loadable_form(path):
        raise ConfigError(
            f"ckpt_path={path} is not a checkpoint (a .ckpt file, or the .ckpt folder of a preset that writes parts); "
            "give one, e.g. <run dir>/checkpoints/last.ckpt, or a run folder"
        )
    if path.is_file() and pickled_keys_include(path, "pytorch-lightning_version") is False:
        raise ConfigError(
            f"ckpt_path={path} is not a training checkpoint (weights alone, say): ckpt_path continues a training "
            "from its checkpoint (e.g. <run dir>/checkpoints/last.ckpt); to start from pretrained weights, load them "
            "in your net (docs/your-model.md, 'Pretrained weights')"
        )


def has_checkpoint_io(strategy: Any) -> bool:
    """Whether the strategy's config gives a CheckpointIO of its own (Lightning refuses one there and in plugins)."""
    return OmegaConf.is_config(strategy) and strategy.get("checkpoint_io") is not None


def synchronised_batchnorm(cfg: DictConfig, model: L.LightningModule, trainer: L.Trainer) -> bool:
    """Whether this run's BatchNorm layers are synchronised over its data-parallel processes."""
    data_parallel = preset(cfg) in ("ddp", "ddp_spawn")  # model_parallel and pipeline check BatchNorm themselves
    return data_parallel and cfg.trainer.sync_batchnorm and needs_sync(model, trainer.world_size)


def run_summary(cfg: DictConfig, trainer: L.Trainer) -> dict[str, Any]:
    """The resolved config plus how the run is laid out, as logged to wandb."""
    summary = OmegaConf.to_container(cfg, resolve=True)
    summary["run"] = {
        "engine": "lightning",
        "strategy_preset": HydraConfig.get().runtime.choices["strategy"],  # as given: a preset of yours by its name
        "world_size": trainer.world_size,
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
        "data_parallel_size": data_parallel_size(trainer),
        "per_device_batch_size": per_device_batch_size(
            cfg.data.batch_size, data_parallel_size(trainer), trainer.accumulate_grad_batches
        ),
        "layout": device_layout(trainer).as_config(),
    }
    return summary


def preset(cfg: DictConfig) -> str:
    """The built-in strategy preset this run is: the one it was composed with (strategy=NAME), or for a preset file of
    yours the built-in one with the same strategy class (parallel/presets.py)."""
    return built_in_preset(HydraConfig.get().runtime.choices["strategy"], cfg.strategy)
