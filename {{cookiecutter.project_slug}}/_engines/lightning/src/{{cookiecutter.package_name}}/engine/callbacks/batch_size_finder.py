"""Find the largest per-device batch that fits, under single, ddp and ddp_spawn alike.

Lightning's BatchSizeFinder refuses distributed strategies. This one runs the trials on the bare
LightningModule (no DDP wrapper, so no gradient all-reduce that a failed rank would never join),
and after each trial all-reduces "did it fit?": every rank tries the same size and shrinks together.
Not for presets whose forward pass is itself a collective (tensor or pipeline parallel), nor for a net whose
BatchNorm is synchronised: there a rank that fails mid-trial would leave the others waiting.
"""

import time

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from ...data.batch_sizes import batch_parts, global_batch_size, per_device_batch_size
from ...errors import ConfigError
from ...parallel.batchnorm import oom_handling_problem
from ...runtime import memory
from ...runtime.interrupt import stops_at_once
from ...runtime.memory import FINDER_REFUSED, LR_SCALINGS, changed_batch_message, free_memory, is_oom_error, with_margin
from ...runtime.optimization import scale_lr
from ..strategies import data_parallel_size


class BatchSizeFinder(L.Callback):
    """Before training, set the DataModule's batch to the largest per-device batch that fits, less a margin, and
    at most the training split (one step per epoch). Opt-in: it changes the optimisation, and says by how much.

    Refused (before training) under dp, whose trials would run on the first GPU alone and size the global
    batch by it, and under fsdp, model_parallel and pipeline, whose forward is itself a collective.

    The per-device batch (one micro-batch) changes, so the GLOBAL batch becomes per-device x
    trainer.accumulate_grad_batches x data-parallel replicas (logged as batch_size_finder/global_batch_size).
    lr_scaling: "linear" or "sqrt" scales the learning rate with the global batch; "none" (default) leaves it as
    configured.

    The batch found is saved in checkpoints: a resumed training keeps it (and its learning rate, restored with the
    optimizer) instead of searching again, which would change the optimisation in the middle of the run.
    """

    supported_presets = ("single", "ddp", "ddp_spawn")
    refused_because = {
        **FINDER_REFUSED,
        "dp": "its trials would run on the first GPU alone and size the global batch by it",
    }
    setting, turn_off = "oom.find_batch_size", "oom.find_batch_size=false"  # what refusals name

    def __init__(
        self,
        max_batch_size: int = 4096,
        margin: float = 0.1,
        tolerance: float = 0.05,
        steps_per_trial: int = 2,
        lr_scaling: str = "none",
    ) -> None:
        if lr_scaling not in LR_SCALINGS:
            raise ValueError(f"lr_scaling={lr_scaling!r}; valid: {', '.join(LR_SCALINGS)}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin={margin} must be in [0, 1)")
        self.max_batch_size, self.margin, self.tolerance = max_batch_size, margin, tolerance
        self.steps_per_trial, self.lr_scaling = steps_per_trial, lr_scaling
        self.global_batch_size: int | None = None  # found, or restored from a checkpoint

    def state_dict(self) -> dict[str, int]:
        return {"global_batch_size": self.global_batch_size} if self.global_batch_size else {}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.global_batch_size = state_dict.get("global_batch_size")

    def check_compatible(self, trainer: L.Trainer, module: L.LightningModule, synchronised_batchnorm: bool) -> None:
        """Refuse, before training, a run this callback cannot serve (strategies.check_layout calls it)."""
        if synchronised_batchnorm:
            raise ConfigError(
                oom_handling_problem(self.setting, splits_batches=False) + f", or turn it off with {self.turn_off}"
            )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        if self.global_batch_size:  # restored with the checkpoint (before this hook) this training resumes from
            datamodule.batch_size = self.global_batch_size
            rank_zero_info(f"BatchSizeFinder: global batch {self.global_batch_size}, found before the restart")
            return
        replicas, accumulation = data_parallel_size(trainer), trainer.accumulate_grad_batches
        parts = batch_parts(replicas, accumulation)  # a trial's batch is one micro-batch of one replica
        dataset = datamodule.train_dataloader().dataset
        old_global = datamodule.batch_size
        saved = _snapshot(pl_module, trainer.optimizers)
        start = time.perf_counter()
        maximum = min(self.max_batch_size, len(dataset) // parts)
        fits = lambda size: self._fits(trainer, pl_module, dataset, size)  # noqa: E731
        first = per_device_batch_size(old_global, replicas, accumulation)
        with stops_at_once("the batch-size search"):
            largest, trials = memory.search(fits, first, maximum, self.tolerance)  # by its module: the bench times it
            _restore(pl_module, trainer.optimizers, saved)
            if largest == 0:
                raise RuntimeError("BatchSizeFinder: not even a batch of 1 fits in memory")
            per_device = with_margin(largest, maximum, self.margin)
            # The trials ran with the optimizer state their first step allocated; training starts without it and
            # allocates it after its first step's activations: another layout in the device's memory (measured on
            # an H200: 76-129 MiB reserved but unusable, more than the margin). The size is checked from that start,
            # as training will run it, and shrinks until it fits.
            while per_device > 1 and not self._fits_from_the_start(trainer, pl_module, dataset, per_device, saved):
                per_device = max(1, int(per_device * (1 - max(self.margin, 0.05))))
        datamodule.batch_size = self.global_batch_size = global_batch_size(per_device, replicas, accumulation)
        lr_factor = self._scale_learning_rate(trainer, self.global_batch_size / old_global)
        found = {
            "batch_size_finder/largest_fitting": largest,
            "batch_size_finder/per_device_batch_size": per_device,
            "batch_size_finder/global_batch_size": self.global_batch_size,
            "batch_size_finder/trials": trials,
            "batch_size_finder/seconds": time.perf_counter() - start,
            "batch_size_finder/lr_factor": lr_factor,
        }
        rank_zero_info(
            f"BatchSizeFinder: largest per-device batch that fits {largest}; using {per_device} per device after "
            f"{trials} trials in {found['batch_size_finder/seconds']:.1f}s: "
            + changed_batch_message(old_global, self.global_batch_size, len(dataset))
            + f" (lr x{lr_factor:.3g})"
        )
        for logger in trainer.loggers:
            logger.log_metrics(found, step=trainer.global_step)

    def _fits(self, trainer: L.Trainer, pl_module: L.LightningModule, dataset, size: int, steps: int = 0) -> bool:
        oom = False
        try:
            for _ in range(steps or self.steps_per_trial):
                batches = DataLoader(dataset, batch_size=size, collate_fn=trainer.datamodule.data.collate_fn)
                _train_on(trainer, pl_module, next(iter(batches)))
        except Exception as error:
            if not is_oom_error(error):
                raise
            oom = True
        for optimizer in trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        free_memory()  # outside `except`, where the failed step's tensors are no longer referenced
        return trainer.strategy.reduce_boolean_decision(not oom, all=True)

    def _fits_from_the_start(self, trainer: L.Trainer, pl_module: L.LightningModule, dataset, size: int, saved) -> bool:
        free_memory()
        fits = self._fits(trainer, pl_module, dataset, size, max(2, self.steps_per_trial))  # the optimizer state too
        _restore(pl_module, trainer.optimizers, saved)
        free_memory()
        return fits

    def _scale_learning_rate(self, trainer: L.Trainer, ratio: float) -> float:
        """Scale the learning rate the schedule starts from; the module builds its schedule again after this
        callback (module.Classifier.on_fit_start), for the new steps per epoch and this learning rate."""
        factor = LR_SCALINGS[self.lr_scaling](ratio)
        for optimizer in trainer.optimizers:
            scale_lr(optimizer, factor)
        return factor


def _train_on(trainer: L.Trainer, pl_module: L.LightningModule, batch) -> None:
    """One optimizer step on the bare module in the order of Lightning's loop: the forward (with the gradients of
    the step before still held: Lightning frees them only before the backward), the backward, then the optimizer
    step and its state."""
    batch = trainer.strategy.batch_to_device(batch)
    with trainer.precision_plugin.train_step_context():
        output = pl_module.training_step(batch, 0)
    loss = output["loss"] if isinstance(output, dict) else output
    for optimizer in trainer.optimizers:
        optimizer.zero_grad(set_to_none=True)
    loss.backward()
    for optimizer in trainer.optimizers:
        optimizer.step()


def _snapshot(pl_module: L.LightningModule, optimizers: list[torch.optim.Optimizer]) -> dict:
    """Weights, optimizer state and RNG, copied to the CPU (a copy on the device would skew the trials)."""
    return {
        "model": _cpu_copy(pl_module.state_dict()),
        "optimizers": [_cpu_copy(optimizer.state_dict()) for optimizer in optimizers],
        "rng": torch.random.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }


def _cpu_copy(value):
    if torch.is_tensor(value):
        return value.to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _cpu_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu_copy(item) for item in value)
    return value


def _restore(pl_module: L.LightningModule, optimizers: list[torch.optim.Optimizer], saved: dict) -> None:
    pl_module.load_state_dict(saved["model"])
    for optimizer, state in zip(optimizers, saved["optimizers"], strict=True):
        optimizer.load_state_dict(state)
    torch.random.set_rng_state(saved["rng"])
    if saved["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
