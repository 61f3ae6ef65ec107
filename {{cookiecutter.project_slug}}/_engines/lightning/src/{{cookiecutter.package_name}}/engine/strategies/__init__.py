"""What the presets share: how many data-parallel replicas a run has, and the per-device batch.

Lightning ships ddp and ddp_spawn (configs/strategy/*.yaml point straight at its classes);
the modules here add what it lacks.
"""

import sys
from contextlib import AbstractContextManager, nullcontext

import lightning as L
from lightning.pytorch.plugins import TorchSyncBatchNorm
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn

from ...data.batch_sizes import per_device_batch_size
from ...errors import ConfigError
from ...parallel.batchnorm import synchronise
from ...parallel.launcher import one_process_note
from ...parallel.layout import Layout
from ...runtime.hardware import oversubscribed_note


def data_parallel_size(trainer: L.Trainer) -> int:
    """Number of replicas that each see a different slice of the global batch.

    Strategies that split the model instead of the data (tensor, layer or pipeline parallel)
    expose `data_parallel_size` and `data_parallel_rank`; for the DDP family every process is a replica.
    """
    return int(getattr(trainer.strategy, "data_parallel_size", trainer.world_size))


def device_layout(trainer: L.Trainer) -> Layout:
    """The run's replicas x shards x tensor_parallel x stages (parallel/layout.py): the strategy's own, where it has
    one; else data parallel over every process (single, ddp, ddp_spawn)."""
    own = getattr(trainer.strategy, "device_layout", None)
    return own() if own is not None else Layout(replicas=trainer.world_size)


def data_parallel_rank(trainer: L.Trainer) -> int:
    """Which slice of the global batch this process reads (0 .. data_parallel_size - 1)."""
    return int(getattr(trainer.strategy, "data_parallel_rank", trainer.global_rank))


def check_layout(
    preset: str,
    trainer: L.Trainer,
    global_batch_size: int,
    module: L.LightningModule,
    synchronised_batchnorm: bool = False,
) -> None:
    """Refuse, before any process starts, a layout the preset cannot run.

    A strategy with limits of its own declares them in a `check_layout(trainer, module, global_batch_size)` method,
    a callback in a `check_compatible(trainer, module, synchronised_batchnorm)` method.
    """
    if preset == "single" and trainer.world_size > 1:
        raise ConfigError(
            f"strategy=single runs one device but trainer.devices={trainer.num_devices} x "
            f"trainer.num_nodes={trainer.num_nodes} asks for {trainer.world_size}; use strategy=ddp for several"
        )
    per_device_batch_size(global_batch_size, data_parallel_size(trainer), trainer.accumulate_grad_batches)
    check_validation_interval(trainer.val_check_interval, trainer.accumulate_grad_batches)
    every = trainer.check_val_every_n_epoch  # (0: a ZeroDivisionError at the first epoch's end)
    if every is not None and not (type(every) is int and every >= 1):
        raise ConfigError(
            f"trainer.check_val_every_n_epoch={every} must be a whole number >= 1, or null (validation every "
            "trainer.val_check_interval training batches, counted over epochs)"
        )
    for callback in trainer.callbacks:  # e.g. the OOM toolkit: a callback that works under some presets only
        supported = getattr(callback, "supported_presets", None)
        if supported is not None and preset not in supported:
            reason = getattr(callback, "refused_because", {}).get(preset)
            raise ConfigError(
                f"{getattr(callback, 'setting', type(callback).__name__)} works under strategy={'|'.join(supported)}, "
                f"not strategy={preset}"
                + (f" ({reason})" if reason else "")
                + f"; turn it off with {getattr(callback, 'turn_off', '~callbacks.<its name>')}"
            )
        if hasattr(callback, "check_compatible"):
            callback.check_compatible(trainer, module, synchronised_batchnorm)
    if hasattr(trainer.strategy, "check_layout"):
        trainer.strategy.check_layout(trainer, module, global_batch_size)
    # (after the refusals: a refused command says one line)
    layers = isinstance(trainer.strategy, SingleDeviceStrategy)  # model_parallel's layers mode: one process, always
    if preset in ("ddp", "ddp_spawn", "fsdp", "model_parallel") and not layers and trainer.world_size == 1:
        # Not refused: Lightning runs it, and devices=auto on a one-GPU machine is a fair choice. Said, because on
        # the CPU devices=auto means one process, which a user asking for ddp (fsdp, ...) rarely means.
        layout = f" (trainer.devices={trainer.num_devices} x trainer.num_nodes={trainer.num_nodes})"
        print(one_process_note(preset, layout), file=sys.stderr)
    on_cpu = trainer.strategy.root_device.type == "cpu"
    if on_cpu and trainer.global_rank == 0 and (note := oversubscribed_note(trainer.num_devices)):
        print(note, file=sys.stderr)


def check_validation_interval(interval: int | float, accumulate: int) -> None:
    """A validation, and the best checkpoint saved after it, must fall between optimizer steps: a checkpoint inside
    one has lost the micro-batches' gradients accumulated so far, and a training resumed from it is not the one
    that would have gone on (trainer.val_check_interval counts micro-batches; a fraction of the epoch would too)."""
    if interval == 0:  # (Lightning's ZeroDivisionError in the first epoch)
        raise ConfigError(
            "trainer.val_check_interval=0 must be a number of training batches (1 or more) or a share of the epoch "
            "above 0.0 and up to 1.0"
        )
    inside = interval % accumulate if isinstance(interval, int) else interval < 1.0
    if accumulate > 1 and inside:
        raise ConfigError(
            f"trainer.val_check_interval={interval} counts micro-batches: give a multiple of "
            f"trainer.accumulate_grad_batches={accumulate} (validation and its checkpoint between optimizer steps)"
        )


def check_validation_in_epoch(trainer: L.Trainer, batches: int) -> None:
    """An interval of N micro-batches validates within each epoch of `batches` (Lightning's ValueError once fit had
    started, after the run folder and wandb run were made); with trainer.check_val_every_n_epoch=null it counts
    across epochs."""
    interval = trainer.val_check_interval
    if isinstance(interval, int) and trainer.check_val_every_n_epoch is not None and interval > batches:
        raise ConfigError(
            f"trainer.val_check_interval={interval} is past the end of an epoch of {batches} training batches: give "
            f"1 to {batches}, or trainer.check_val_every_n_epoch=null to count batches across epochs"
        )


def model_init_context(trainer: L.Trainer) -> AbstractContextManager:
    """Where engine/training.py builds the model: on the meta device for strategies that shard it and allocate only each
    rank's shards (`builds_on_meta`), else as usual (on the CPU, moved to the device by Lightning)."""
    if getattr(trainer.strategy, "builds_on_meta", False):
        return trainer.init_module(empty_init=True)
    return nullcontext()


class BatchNormSync(TorchSyncBatchNorm):
    """trainer.sync_batchnorm on any device: Lightning's plugin converts BatchNorm layers to torch's SyncBatchNorm,
    which runs on GPUs only; this one converts them to batchnorm.SynchronisedBatchNorm on CPU processes. Lightning
    applies it when fit starts (model=the LightningModule) and reverts torch's layers at the end; ours stay, as
    they are plain BatchNorm outside distributed training."""

    def apply(self, model: nn.Module) -> nn.Module:
        return synchronise(model, model.trainer.strategy.root_device.type)
