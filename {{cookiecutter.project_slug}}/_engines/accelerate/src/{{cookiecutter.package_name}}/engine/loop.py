"""The Accelerate engine's training loop: epochs of optimizer steps (gradient accumulation, clipping, the OOM
recovery's steps), the checkpoints every checkpoint.every_n_steps steps and after each epoch's validation, and where
the loop stands (Progress), which every checkpoint saves so that a resumed run continues with the next batch."""

from dataclasses import dataclass, field
from math import inf
from typing import Any

import torch
from accelerate import Accelerator
from omegaconf import DictConfig
from torch import nn
from torch.optim.lr_scheduler import LRScheduler
from tqdm import tqdm

from ..data.loading import Data
from ..errors import ConfigError
from ..parallel.sharding import clip_grad_norm_, clip_grad_value_
from ..runtime.interrupt import Interrupt
from ..runtime.memory import OutOfMemoryStop
from ..runtime.metrics import best_mode, check_train_loss, check_val_loss, cross_entropy
from ..runtime.optimization import current_lr, total_steps
from ..runtime.real_targets import RealTargets
from ..tracking.epoch_metrics import append_epoch_metrics, is_final
from .checkpoints import Checkpoints
from .evaluation import batches, evaluate, log, prefixed, to_device
from .oom.device_memory import log_device_memory
from .oom.recovery import OOMRecovery
from .strategies import Strategy


@dataclass
class Progress:
    """Where training is; saved with every checkpoint, so that a resumed run continues where it stopped."""

    epoch: int = 0
    loader: dict[str, Any] = field(default_factory=dict)  # the training loader's position mid-epoch ({}: at a start)
    global_step: int = 0  # optimizer steps done
    best: float | None = None  # the best checkpoint's value of checkpoint.monitor
    monitor: str = "val/loss"  # which metric `best` is of (resumed with another: the next validation is the best)
    found_batch_size: int = 0  # the global batch that oom.find_batch_size found (0: not searched yet)
    oom_recovery: dict[str, int] = field(default_factory=dict)  # oom.recovery's state: its micro-batch size

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "best_val_loss" in state and "best" not in state:  # a checkpoint from before checkpoint.monitor
            state = {**state, "best": None if state["best_val_loss"] == inf else state["best_val_loss"]}
        vars(self).update({key: value for key, value in state.items() if key in vars(self)})


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean loss of a batch (change it for a loss of your own: docs/your-model.md)."""
    return cross_entropy(logits, target)


def fit(
    accelerator: Accelerator,
    cfg: DictConfig,
    strategy: Strategy,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    loaders: dict[str, Any],
    progress: Progress,
    checkpoints: Checkpoints,
    recovery: OOMRecovery | None,
    interrupt: Interrupt,
    bar: tqdm,
) -> int | None:
    """Train to trainer.max_epochs or trainer.max_steps; returns the step a Ctrl-C (`interrupt`) stopped it after,
    saved, or None. `bar`: the progress bar (step_bar), advanced at every optimizer step."""
    trainer, every_n_steps = cfg.trainer, cfg.checkpoint.every_n_steps
    step_loss = 0.0  # the sum of the optimizer step's micro-batch losses so far
    since_log = SinceLog() if cfg.oom.log_loss_mean else None  # train/loss_mean
    # Padding targets (-100) weighed as on one device, whichever preset splits the batch (runtime/real_targets.py)
    real_targets = RealTargets(accumulation(cfg))
    train_loss = real_targets.weighted(loss_fn)
    model.train()
    epochs = inf if trainer.max_epochs in (None, -1) else trainer.max_epochs  # as in Lightning: no limit
    while progress.epoch < epochs and not done(progress, trainer.max_steps):
        epoch, loader = progress.epoch, loaders["train"]
        # This epoch's seeded shuffle, from the first batch not trained yet: a resumed run goes on with the
        # next batch, and its sampler (or stream) leaves out the ones before it (nothing is read twice).
        loader.load_state_dict(progress.loader or {"epoch": epoch, "samples_done": 0})
        since_log = since_log and SinceLog()  # each epoch's own, as Lightning's item logger
        for x, y in loader:
            x, y = to_device(accelerator, x, y)
            real_targets.count(y)
            logged = (progress.global_step + 1) % trainer.log_every_n_steps == 0
            with accelerator.accumulate(model):
                if recovery:  # None: an out-of-memory error made it skip the batch (recovery refuses accumulation)
                    try:
                        loss = recovery.train_step(accelerator, model, x, y, train_loss, progress.global_step)
                    except OutOfMemoryStop as stop:  # every process stops here together: save, then stop
                        progress.loader, progress.oom_recovery = loader.state_dict(), recovery.state_dict()
                        checkpoints.save(progress.global_step)
                        checkpoints.finish()
                        stop.checkpoint = checkpoints.last.resolve()
                        raise
                    progress.oom_recovery = recovery.state_dict()  # saved with the next checkpoint
                else:
                    loss = strategy.train_step(accelerator, model, x, y, train_loss, logged=logged)
                if loss is not None:
                    step_loss = step_loss + loss
                if accelerator.sync_gradients:
                    real_targets.scale_gradients(p for group in optimizer.param_groups for p in group["params"])
                    if trainer.gradient_clip_val:
                        # The norm of the whole gradient, tensor-parallel shards too (the shared clip, as in the
                        # Lightning engine: accelerator.clip_grad_norm_ handles shards only in accelerate releases
                        # newer than this project's minimum, 1.10), of the 16-mixed gradients once unscaled.
                        accelerator.unscale_gradients()
                        by_value = trainer.get("gradient_clip_algorithm", "norm") == "value"  # (an older config: none)
                        clip = clip_grad_value_ if by_value else clip_grad_norm_
                        clip(model.parameters(), trainer.gradient_clip_val)
                    lr = current_lr(optimizer)
                    if loss is not None or not recovery:  # a skipped batch left no gradient: no step (16-mixed's
                        optimizer.step()  # gradient scaler refuses a step without its inf checks), as in Lightning
                    scheduler.step()  # once per optimizer step (not accelerate's prepared scheduler, which steps
                    optimizer.zero_grad()  # once per process unless the batch is split: not the global-batch meaning)
            if not accelerator.sync_gradients:
                continue
            if loss is not None and (factor := real_targets.factor()) is not None:
                step_loss = step_loss * factor  # the accumulated micro-batches' padding, as their gradient
            real_targets.reset()
            if since_log and loss is not None:
                since_log.add(step_loss / accumulation(cfg))
            # One process asked to stop (Ctrl-C) logs the step it stops after, as Lightning does (several processes
            # agree to stop at a logged step: stop_now).
            stopping = accelerator.num_processes == 1 and interrupt.requested
            if loss is not None and (logged or stopping):
                # The only host sync of the step, and only on logging steps: the mean over the micro-batches and
                # all processes is the global batch's loss (processes that share a batch hold the same loss).
                loss = accelerator.reduce(step_loss / accumulation(cfg), "mean").item()
                check_train_loss(loss, progress.global_step)  # the same on every process: all stop here
                metrics = {"train/loss": loss, "train/lr": lr, **strategy.step_metrics()}
                if since_log:  # (a second sync, of the toolkit's)
                    metrics["train/loss_mean"] = strategy.mean_of_step_metrics(accelerator, since_log.take()).item()
                log(accelerator, {**metrics, "epoch": epoch}, progress.global_step)
                bar.set_postfix(epoch=epoch, loss=f"{loss:.4g}", refresh=False)
            step_loss = 0.0
            progress.global_step += 1
            bar.update()
            if done(progress, trainer.max_steps) and loader.batches_done < len(loader):
                break  # (on the epoch's last batch, its end comes first: validation, as Lightning runs it)
            checkpoints.link_written()  # a checkpoint written in the background since the last step: in place now
            saved = every_n_steps and progress.global_step % every_n_steps == 0
            if saved and loader.batches_done < len(loader):
                progress.loader = loader.state_dict()
                checkpoints.save(progress.global_step)  # (the epoch's last batch: its end saves just after)
            if stop_now(accelerator, interrupt, progress.global_step, trainer.log_every_n_steps):
                if not saved or loader.batches_done == len(loader):  # Ctrl-C: save this step, then stop
                    progress.loader = loader.state_dict()
                    checkpoints.save(progress.global_step)
                return progress.global_step
        else:  # a whole epoch: validate
            progress.epoch, progress.loader = progress.epoch + 1, {}
            validate(accelerator, cfg, strategy, model, loaders["val"], progress, epoch, checkpoints)
            if recovery:
                recovery.epoch_ended(epoch)
            continue
        # Stopped at trainer.max_steps inside an epoch: its last steps validated too, as Lightning does a stopped run
        # (the best checkpoint, the test pass and a search's value left them out, unsaid)
        progress.loader = loader.state_dict()
        validate(accelerator, cfg, strategy, model, loaders["val"], progress, progress.epoch, checkpoints)
    return None


class SinceLog:
    """The losses of the optimizer steps since the last log, summed on the device (no host sync until it logs)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | float = 0.0
        self.steps = 0

    def add(self, loss: torch.Tensor) -> None:
        self.total, self.steps = self.total + loss.detach(), self.steps + 1

    def take(self) -> torch.Tensor:
        """Their mean; the sum starts again from 0."""
        mean, self.total, self.steps = torch.as_tensor(self.total / max(self.steps, 1)), 0.0, 0
        return mean


def step_bar(accelerator: Accelerator, cfg: DictConfig, total: int, done: int) -> tqdm:
    """The training's progress bar on the first process (trainer.enable_progress_bar, as in Lightning): optimizer
    steps done of the `total`, from `done` (a resumed run's), the epoch and the last logged loss. tqdm redraws it
    at most 10 times a second; a step costs it a counter and a clock read."""
    shown = cfg.trainer.enable_progress_bar and accelerator.is_main_process
    return tqdm(total=total, initial=done, desc="Training", unit="step", dynamic_ncols=True, disable=not shown)


def stop_now(accelerator: Accelerator, interrupt: Interrupt, step: int, log_every_n_steps: int) -> bool:
    """Whether a Ctrl-C asks to stop after this step: one process at once; several when any of them was asked, which
    they find out together at each logged step."""
    if accelerator.num_processes == 1:
        return interrupt.requested
    if step % log_every_n_steps:
        return False
    asked = torch.tensor(float(interrupt.requested), device=accelerator.device)
    return accelerator.reduce(asked, "sum").item() > 0


def training_steps(cfg: DictConfig, data: Data, replicas: int, rank: int) -> int:
    """Optimizer steps of the whole training, which the schedule spans (as Lightning's estimated_stepping_batches):
    trainer.max_steps, or the epochs' steps if fewer."""
    loader = data.loader("train", replicas, rank, accumulate=accumulation(cfg), limit=cfg.trainer.limit_train_batches)
    steps_per_epoch = len(loader) // accumulation(cfg)
    return total_steps(cfg.trainer.max_steps, cfg.trainer.max_epochs, steps_per_epoch)


def accumulation(cfg: DictConfig) -> int:
    """Micro-batches per optimizer step: data.batch_size stays the global batch, each is a part of it."""
    return cfg.trainer.accumulate_grad_batches


def done(progress: Progress, max_steps: int) -> bool:
    return 0 < max_steps <= progress.global_step


def validate(
    accelerator: Accelerator,
    cfg: DictConfig,
    strategy: Strategy,
    model: nn.Module,
    loader: Any,
    progress: Progress,
    epoch: int,
    checkpoints: Checkpoints,
) -> None:
    """Evaluate on the validation split, log, and checkpoint: the latest state, and the best by checkpoint.monitor."""
    if batches(cfg.trainer.limit_val_batches, len(loader)) == 0:  # validation turned off: the latest state only
        if cfg.oom.log_memory:  # (each epoch, as Lightning's callback logs it at the epoch's end)
            log_device_memory(accelerator, strategy, progress.global_step)
        checkpoints.save(progress.global_step)
        return
    metrics = evaluate(accelerator, model, loader, loss_fn, cfg.trainer.limit_val_batches)
    check_val_loss(metrics["loss"], epoch)  # before anything of the epoch is logged or saved, as in Lightning
    # At the step of the last optimizer step taken (its train/loss's), where Lightning logs validation too: runs of
    # both engines chart alike
    log(accelerator, {**prefixed("val", metrics), "epoch": epoch}, max(progress.global_step - 1, 0))
    if cfg.epoch_metrics and accelerator.is_main_process:  # the search reads it to prune a trial
        final = is_final(epoch, cfg.trainer.max_epochs, progress.global_step, cfg.trainer.max_steps)
        append_epoch_metrics(cfg.epoch_metrics, epoch, prefixed("val", metrics), final)
    if cfg.oom.log_memory:
        log_device_memory(accelerator, strategy, progress.global_step)
    monitor = cfg.checkpoint.monitor
    if (value := metrics.get(monitor.removeprefix("val/"))) is None:  # val/acc of a regression: as Lightning's
        raise ConfigError(
            f"checkpoint.monitor={monitor}: the validation logs no {monitor} (values as targets: no "
            "accuracy or perplexity); give checkpoint.monitor=val/loss"
        )
    if progress.monitor != monitor:  # resumed with another checkpoint.monitor: a value of another metric
        progress.best, progress.monitor = None, monitor
    best = progress.best is None or (value > progress.best if best_mode(monitor) == "max" else value < progress.best)
    if best:
        progress.best = value
    checkpoints.save(progress.global_step, best=best)
