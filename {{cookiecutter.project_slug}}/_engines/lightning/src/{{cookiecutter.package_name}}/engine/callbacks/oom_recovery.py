"""Survive an out-of-memory error in a training step, in its forward or its backward: redo the step as gradient
accumulation over smaller micro-batches (and keep the micro-batch size that worked), or skip it.

A callback cannot re-run Lightning's optimization step, so this one wraps the module's training_step (and its
optimizer_zero_grad, which it holds back once per step) for the duration of training: the wrapped step runs the
forward AND the backward of the batch, in micro-batches of `micro_batch_size` samples, catching an OOM in either.
(Lightning's own accumulation, trainer.accumulate_grad_batches, accumulates over loader batches and cannot redo
one: hence the hand-written loop.) With several processes the backward runs inside DDP's forward, where DDP does
not synchronise gradients: every rank then reports "did I run out of memory?" through one small all-reduced flag,
so all ranks take the same decision (and keep the same micro-batch size) and none waits forever for a rank that
failed. The step returns the batch's loss plus a zero term over every
parameter, whose backward (run by Lightning) makes DDP average the gradients computed here.
A net whose forward is itself a collective (synchronised BatchNorm) is refused: an OOM mid-forward on one rank
would leave the others in it.
"""

from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning_utilities.core.apply_func import apply_to_collection

from ...errors import ConfigError
from ...parallel.batchnorm import micro_batch_split_problem, oom_handling_problem, uses_batchnorm
from ...runtime.memory import (
    RECOVERY_REFUSED,
    OutOfMemoryStop,
    configure_allocator,
    free_memory,
    halved,
    is_oom_error,
    memory_summary,
    rng_state,
    set_rng_state,
)


class OOMRecovery(L.Callback):
    """policy: "split" keeps the batch (data.batch_size stays the global batch) and runs every step as gradient
    accumulation over micro-batches of `micro_batch_size` samples per device, the largest that fits: it starts at
    the whole per-device batch; an OOM on any rank halves it on every rank and the step is redone from the same
    weights and random state, so the step, its loss and its gradient are the whole batch's (the losses of a run
    without OOMs). The size is this callback's state in checkpoints: a resumed run starts from it. (The idea of
    Composer's device_train_microbatch_size="auto", for data-parallel runs.) "skip" drops the batch (its
    optimizer step changes nothing). max_consecutive: OOMs in a row, without a step that worked in between, before
    stopping. empty_cache_every_n_epochs: 0 never (emptying the cache synchronises the device,
    so it is done at epoch ends only). Refused (before training) under dp (the replicas run in threads),
    model_parallel (a rank that fails mid-forward leaves the others in a collective) and pipeline (the schedule
    runs the step, not the module's training_step)."""

    supported_presets = ("single", "ddp", "ddp_spawn")
    refused_because = RECOVERY_REFUSED  # said in the refusal of any other preset
    setting, turn_off = "oom.recovery", "oom.recovery=null"  # what refusals name (build_callbacks: +callbacks.NAME's)

    def __init__(self, policy: str = "split", max_consecutive: int = 3, empty_cache_every_n_epochs: int = 0) -> None:
        if policy not in ("skip", "split"):
            raise ValueError(f"policy={policy!r}; valid: skip, split")
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive={max_consecutive} must be >= 1")
        configure_allocator()  # callbacks are built before the trainer touches CUDA
        self.policy, self.max_consecutive = policy, max_consecutive
        self.empty_cache_every_n_epochs = empty_cache_every_n_epochs
        self.events = self.consecutive = 0
        self.micro_batch_size = 0  # samples per micro-batch on each device, the last that fitted; 0: the whole batch
        self._keep_grads = self._skipping = False

    def check_compatible(self, trainer: L.Trainer, module: L.LightningModule, synchronised_batchnorm: bool) -> None:
        """Refuse, before training, a run this callback cannot serve (strategies.check_layout calls it)."""
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError(
                f"{self.setting} runs the backward itself: use trainer.accumulate_grad_batches=1, or turn it off with "
                + self.turn_off
            )
        if synchronised_batchnorm:
            raise ConfigError(
                oom_handling_problem(self.setting, splits_batches=True) + f", or turn it off with {self.turn_off}"
            )
        if self.policy == "split" and uses_batchnorm(module):
            raise ConfigError(micro_batch_split_problem(f"{self.setting}.policy"))

    def state_dict(self) -> dict[str, int]:
        return {"micro_batch_size": self.micro_batch_size, "events": self.events}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.micro_batch_size, self.events = state_dict["micro_batch_size"], state_dict["events"]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.micro_batch_size = _agreed(trainer, self.micro_batch_size)  # restored from a checkpoint, or 0
        if self.micro_batch_size:
            rank_zero_info(f"OOMRecovery: micro-batches of {self.micro_batch_size}, as the checkpoint says")
        # Installed now, not at fit start, so that the batch-size finder's trials see their OOMs.
        pl_module.training_step = partial(self._guarded_step, trainer, pl_module, pl_module.training_step)
        pl_module.optimizer_zero_grad = partial(self._zero_grad, pl_module.optimizer_zero_grad)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        del pl_module.training_step, pl_module.optimizer_zero_grad  # back to the class's methods

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        every = self.empty_cache_every_n_epochs
        if every and (trainer.current_epoch + 1) % every == 0:
            free_memory()

    def _guarded_step(self, trainer: L.Trainer, pl_module: L.LightningModule, step, batch, batch_idx: int):
        size = len(_first_tensor(batch))
        rng = rng_state(pl_module.device)
        while True:
            micro = min(self.micro_batch_size or size, size)
            loss, oom = None, False
            try:
                loss = self._forward_backward(trainer, pl_module, step, batch, batch_idx, micro)
            except Exception as error:
                if not is_oom_error(error):
                    raise
                oom = True
            if not _any_rank(trainer, oom):
                break
            loss = None  # drop the failed step's graph before freeing
            for optimizer in trainer.optimizers:
                optimizer.zero_grad(set_to_none=True)
            if self.policy == "split":
                self.micro_batch_size = halved(micro)  # at 1 already: try again until max_consecutive stops it
            self._on_oom(trainer, pl_module, micro)
            if self.policy == "skip":
                self._skipping = True  # the gradients are dropped before the optimizer step
                return _gradient_sync_term(pl_module)
            set_rng_state(pl_module.device, rng)  # the redone step draws what the first try drew (dropout)
        if self.consecutive:
            rank_zero_info(f"OOMRecovery: micro-batches of {micro} fit; later steps start from that size")
        self.consecutive = 0
        self._keep_grads = True  # Lightning zeroes gradients after training_step: not this time
        return loss + _gradient_sync_term(pl_module)

    def _forward_backward(self, trainer, pl_module, step, batch, batch_idx: int, micro: int) -> torch.Tensor:
        """Forward and backward of the batch in micro-batches of `micro` samples, each loss weighted by its share,
        so the accumulated gradient and the returned (detached) loss are the whole batch's."""
        for optimizer in trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        size, total = len(_first_tensor(batch)), torch.zeros((), device=pl_module.device)
        for chunk in _micro_batches(batch, micro):
            loss = _loss(step(chunk, batch_idx)) * (len(_first_tensor(chunk)) / size)
            trainer.precision_plugin.pre_backward(loss, pl_module).backward()
            total += loss.detach()
            del loss
        return total

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self._skipping:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    parameter.grad = None  # optimizers leave a parameter without a gradient untouched

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self._skipping:
            self._skipping = False
            outputs.clear()  # a skipped step has no loss: the module and the loggers after us log nothing

    def _zero_grad(self, original, *args) -> None:
        if self._keep_grads:
            self._keep_grads = False
            return
        original(*args)

    def _on_oom(self, trainer: L.Trainer, pl_module: L.LightningModule, micro: int) -> None:
        free_memory()
        self.events += 1
        self.consecutive += 1
        step = trainer.global_step
        rank_zero_info(
            f"OOMRecovery: out of memory at step {step} (micro-batches of {micro}; {self.consecutive} in a row, "
            f"policy {self.policy})\n{memory_summary(pl_module.device)}"
        )
        # The micro-batch size from now on (split: halved; skip: unchanged).
        metrics = {
            "oom/events": self.events,
            "oom/consecutive": self.consecutive,
            "oom/micro_batch_size": self.micro_batch_size or micro,
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        if self.consecutive >= self.max_consecutive:
            self._stop(trainer, step)

    def _stop(self, trainer: L.Trainer, step: int) -> None:
        folder = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else trainer.default_root_dir
        path = Path(folder) / "oom-stop.ckpt"
        trainer.save_checkpoint(path)  # every rank calls it: it synchronises
        stop = OutOfMemoryStop(self.consecutive, step, self.policy, f"{self.setting}.policy")
        stop.checkpoint = path
        raise stop


def _agreed(trainer: L.Trainer, micro_batch_size: int) -> int:
    """The smallest micro-batch size of all ranks (0, the whole batch, is the largest): every rank runs the same."""
    if trainer.world_size == 1:
        return micro_batch_size
    size = torch.tensor(micro_batch_size or 2**62, device=trainer.strategy.root_device)
    smallest = int(trainer.strategy.reduce(size, reduce_op="min"))
    return 0 if smallest == 2**62 else smallest


def _any_rank(trainer: L.Trainer, flag: bool) -> bool:
    """True if `flag` is set on any rank; one small all-reduce when there are several processes."""
    return trainer.strategy.reduce_boolean_decision(flag, all=False) if trainer.world_size > 1 else flag


def _gradient_sync_term(pl_module: L.LightningModule) -> torch.Tensor:
    """Zero, with every trainable parameter in its graph: its backward adds nothing to the gradients, and under
    DDP it is the backward that averages them over the ranks (DDP expects every parameter to get a gradient)."""
    return sum(parameter.sum() for parameter in pl_module.parameters() if parameter.requires_grad) * 0.0


def _loss(output) -> torch.Tensor:
    return output["loss"] if isinstance(output, dict) else output


def _first_tensor(batch) -> torch.Tensor:
    found = []
    apply_to_collection(batch, torch.Tensor, found.append)
    return found[0]


def _micro_batches(batch, size: int) -> list:
    """The batch cut along its first dimension into micro-batches of `size` samples (the last one smaller)."""
    count = -(-len(_first_tensor(batch)) // size)
    return [apply_to_collection(batch, torch.Tensor, lambda t, i=i: t.split(size)[i]) for i in range(count)]
