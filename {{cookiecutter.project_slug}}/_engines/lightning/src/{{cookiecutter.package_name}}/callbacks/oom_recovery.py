"""Survive an out-of-memory error in a training step: skip the batch, or split it into micro-batches.

A callback cannot re-run Lightning's optimization step, so this one wraps the module's training_step
(and its optimizer_zero_grad, which `split` holds back once) for the duration of training. With several
processes every rank reports "did I run out of memory?" after each forward pass through one small
all-reduced flag, before any gradient all-reduce starts, so all ranks take the same decision and none
waits forever for a rank that failed.
Limit: an OOM inside the backward of the whole batch (run by Lightning, after training_step) is not caught.
"""

from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning_utilities.core.apply_func import apply_to_collection

from ..memory import configure_allocator, free_memory, is_oom_error, memory_summary


class OutOfMemoryStop(RuntimeError):
    """Raised, after a checkpoint, when OOMs keep coming: the batch does not fit."""


class OOMRecovery(L.Callback):
    """policy: "skip" drops the batch (its optimizer step changes nothing); "split" computes it as 2, 4,
    8... micro-batches with gradient accumulation, so the step, its loss and its gradient are the whole batch's.
    max_consecutive: OOMs in a row before stopping. empty_cache_every_n_epochs: 0 never (emptying the
    cache synchronises the device, so it is done at epoch ends only). Refused (before training) under dp (the
    replicas run in threads), model_parallel (a rank that fails mid-forward leaves the others in a collective)
    and pipeline (the schedule runs the step, not the module's training_step)."""

    supported_presets = ("single", "ddp", "ddp_spawn")

    def __init__(self, policy: str = "split", max_consecutive: int = 3, empty_cache_every_n_epochs: int = 0) -> None:
        if policy not in ("skip", "split"):
            raise ValueError(f"policy={policy!r}; valid: skip, split")
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive={max_consecutive} must be >= 1")
        configure_allocator()  # callbacks are built before the trainer touches CUDA
        self.policy, self.max_consecutive = policy, max_consecutive
        self.empty_cache_every_n_epochs = empty_cache_every_n_epochs
        self.events = self.consecutive = 0
        self._keep_grads = self._skipping = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.policy == "split" and trainer.accumulate_grad_batches != 1:
            raise ValueError("OOMRecovery(policy=split) accumulates gradients itself: use accumulate_grad_batches=1")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
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
        output, oom = None, False
        try:
            output = step(batch, batch_idx)
        except Exception as error:
            if not is_oom_error(error):
                raise
            oom = True
        if not _any_rank(trainer, oom):
            self.consecutive = 0
            return output
        output = None  # drop the failed forward's graph before freeing
        self._on_oom(trainer, pl_module, parts=1)
        if self.policy == "split":
            return self._split(trainer, pl_module, step, batch, batch_idx)
        # Skip. Returning None is refused under DDP, so return a zero loss over every parameter: its backward
        # completes DDP's gradient all-reduce on every rank; the gradients are then dropped before the step.
        self._skipping = True
        return sum(parameter.sum() for parameter in pl_module.parameters() if parameter.requires_grad) * 0.0

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self._skipping:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    parameter.grad = None  # optimizers leave a parameter without a gradient untouched

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self._skipping:
            self._skipping = False
            outputs.clear()  # a skipped step has no loss: the module and the loggers after us log nothing

    def _split(self, trainer: L.Trainer, pl_module: L.LightningModule, step, batch, batch_idx: int):
        size = len(_first_tensor(batch))
        parts = 2
        while True:
            failed, output = False, None
            try:
                output = self._accumulate(trainer, pl_module, step, batch, batch_idx, parts, size)
            except Exception as error:
                if not is_oom_error(error):
                    raise
                failed = True
            if not _any_rank(trainer, failed):
                return output
            output = None
            for optimizer in trainer.optimizers:
                optimizer.zero_grad(set_to_none=True)
            self._on_oom(trainer, pl_module, parts)
            parts = min(2 * parts, size)

    def _accumulate(self, trainer, pl_module, step, batch, batch_idx: int, parts: int, size: int) -> torch.Tensor:
        """Backward every micro-batch but the last here (locally: under DDP the gradient all-reduce is not
        armed inside a forward); return the last one's loss for Lightning to backward, which all-reduces
        the accumulated gradients. Each loss is weighted by its share, so the sum is the whole batch's mean."""
        for optimizer in trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        self._keep_grads = True  # Lightning zeroes gradients after training_step: not this time
        chunks = _chunks(batch, parts)
        done = torch.zeros((), device=pl_module.device)
        for chunk in chunks[:-1]:
            loss = _loss(step(chunk, batch_idx)) * (len(_first_tensor(chunk)) / size)
            trainer.precision_plugin.pre_backward(loss, pl_module).backward()
            done += loss.detach()
            del loss
        last = _loss(step(chunks[-1], batch_idx)) * (len(_first_tensor(chunks[-1])) / size)
        return last + done  # the value of the whole batch's loss; its gradient flows through `last` only

    def _zero_grad(self, original, *args) -> None:
        if self._keep_grads:
            self._keep_grads = False
            return
        original(*args)

    def _on_oom(self, trainer: L.Trainer, pl_module: L.LightningModule, parts: int) -> None:
        free_memory()
        self.events += 1
        self.consecutive += 1
        step = trainer.global_step
        rank_zero_info(
            f"OOMRecovery: out of memory at step {step} (batch in {parts} part(s); {self.consecutive} in a row, "
            f"policy {self.policy})\n{memory_summary(pl_module.device)}"
        )
        metrics = {"oom/events": self.events, "oom/consecutive": self.consecutive, "oom/parts": parts}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        if self.consecutive >= self.max_consecutive:
            self._stop(trainer, step)

    def _stop(self, trainer: L.Trainer, step: int) -> None:
        folder = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else trainer.default_root_dir
        path = Path(folder) / "oom-stop.ckpt"
        trainer.save_checkpoint(path)  # every rank calls it: it synchronises
        raise OutOfMemoryStop(
            f"{self.consecutive} out-of-memory errors in a row at step {step} (policy {self.policy}); "
            f"checkpoint saved to {path}. Lower data.batch_size or run the batch-size finder (callbacks=oom)."
        )


def _any_rank(trainer: L.Trainer, flag: bool) -> bool:
    """True if `flag` is set on any rank; one small all-reduce when there are several processes."""
    return trainer.strategy.reduce_boolean_decision(flag, all=False) if trainer.world_size > 1 else flag


def _loss(output) -> torch.Tensor:
    return output["loss"] if isinstance(output, dict) else output


def _first_tensor(batch) -> torch.Tensor:
    found = []
    apply_to_collection(batch, torch.Tensor, found.append)
    return found[0]


def _chunks(batch, parts: int) -> list:
    """The batch cut along its first dimension into `parts` micro-batches (fewer if it is smaller)."""
    count = min(parts, len(_first_tensor(batch)))
    return [apply_to_collection(batch, torch.Tensor, lambda t, i=i: t.tensor_split(count)[i]) for i in range(count)]
