"""What both engines share about the optimisation: the optimizer's parameter groups (weight decay, and the kinds
of parameter that fused kernels keep apart) and the learning-rate schedules of configs/scheduler/, built from
torch.optim.lr_scheduler and stepped once per optimizer step."""

import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR

from ..errors import ConfigError

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[..., LRScheduler]  # configs/scheduler/: (optimizer, total_steps=...) -> the schedule


def check_trainable(net: nn.Module) -> None:
    """Refuse a net with nothing to train (a traceback at the first backward; the doctor's, at its timed step)."""
    if not any(param.requires_grad for param in net.parameters()):
        raise ConfigError(
            f"model.net {type(net).__name__} has no trainable parameters (none, or every one frozen with "
            "requires_grad=False): the optimizer would have nothing to train"
        )


def check_optimization(cfg: DictConfig, optimizer: OptimizerFactory, schedule: SchedulerFactory) -> None:
    """Refuse, in one line before training, settings torch takes without a word but which train wrongly (a negative
    clipping norm turns descent into ascent, a floor above 1 raises the learning rate) or fail at the first step
    (an argument the optimizer's class or the schedule does not take, a negative learning rate): `optimizer`
    (model.optimizer) and `schedule` (scheduler) are built here over one parameter, with torch's own checks."""
    clip, every = cfg.trainer.gradient_clip_val, cfg.trainer.log_every_n_steps
    if clip is not None and not (is_number(clip) and clip >= 0):
        raise ConfigError(
            f"trainer.gradient_clip_val={clip} is not a gradient norm: give the largest norm to clip to (e.g. 1.0), "
            "or null for no clipping"
        )
    if (algorithm := cfg.trainer.get("gradient_clip_algorithm", "norm")) not in ("norm", "value"):
        raise ConfigError(f"trainer.gradient_clip_algorithm={algorithm}: give norm or value")
    if not (is_number(every) and int(every) == every >= 1):
        raise ConfigError(f"trainer.log_every_n_steps={every}: give 1 or more (train/loss every that many steps)")
    check_training_length(cfg.trainer.max_epochs, cfg.trainer.max_steps, cfg.checkpoint.every_n_steps)
    warmup_steps, floor = cfg.scheduler.get("warmup_steps", 0), cfg.scheduler.get("min_lr_ratio", 0)
    if not (is_number(warmup_steps) and int(warmup_steps) == warmup_steps >= 0):
        raise ConfigError(f"scheduler.warmup_steps={warmup_steps}: give a number of optimizer steps, 0 or more")
    if not (is_number(floor) and 0 <= floor <= 1):
        raise ConfigError(
            f"scheduler.min_lr_ratio={floor}: the last step's learning rate as a share of model.optimizer.lr; give 0 "
            "to 1"
        )
    try:
        optimizer([nn.Parameter(torch.zeros(1))])
    except TypeError as error:  # an argument its class does not take (e.g. `fused`: torch.optim.RMSprop)
        if (name := unexpected(error)) == "KEY":  # a value of the wrong kind: text where a number goes, say
            text = "a number read with ${oc.env:NAME} is text: give ${oc.decode:${oc.env:NAME}}"
            raise ConfigError(f"model.optimizer: {error}; a setting of the wrong kind? ({text})") from None
        raise ConfigError(
            f"model.optimizer: {error}; drop the argument with ~model.optimizer.{name}, or give one the class takes"
        ) from None
    except ValueError as error:  # torch's own checks: a negative learning rate or weight decay, betas outside [0, 1)
        raise ConfigError(f"model.optimizer: {error}") from None
    except RuntimeError:  # e.g. a fused kernel for the training's device only: its build there decides
        pass
    try:  # (a bad argument was a traceback when the training built the schedule, after the run folder was made)
        built = schedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), total_steps=10)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"scheduler: {error}; {schedule_advice(error)}") from None
    if not isinstance(built, torch.optim.lr_scheduler.LRScheduler):  # a function of yours without its `return`, or
        # one returning the optimizer: a traceback in Lightning; in the Accelerate loop every step stepped twice
        raise ConfigError(
            f"scheduler: {getattr(schedule, 'func', schedule).__name__}(optimizer, total_steps=N) returned "
            f"{type(built).__name__}, not a learning-rate schedule: return the torch.optim.lr_scheduler it makes "
            "(e.g. LambdaLR(optimizer, ...)), as runtime/optimization.py's constant and cosine do"
        )


def unexpected(error: TypeError) -> str:
    """The argument named by "got an unexpected keyword argument 'X'" ("KEY" if another TypeError)."""
    taken = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    return taken.group(1) if taken else "KEY"


def schedule_advice(error: Exception) -> str:
    """What to do about a scheduler config its function refused (a TypeError: an argument; a ValueError: a value)."""
    if (key := unexpected(error)) == "total_steps":  # torch's own classes (StepLR, ...) take no total_steps
        return (
            "the training calls it as scheduler(optimizer, total_steps=N): give a function that takes both, as "
            "runtime/optimization.py's constant and cosine do (wrapping torch's class)"
        )
    if key != "KEY":
        return f"drop the argument with ~scheduler.{key}, or give one it takes"
    if missing := re.search(r"missing \d+ required .*argument: '(\w+)'", str(error)):
        return f"give it: +scheduler.{missing.group(1)}=..."
    return "give settings it takes (configs/scheduler/)"


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def grouped_optimizer(
    optimizer: OptimizerFactory, parameters: Iterable[nn.Parameter], no_decay_norms_and_biases: bool
) -> torch.optim.Optimizer:
    """`optimizer` (model.optimizer) over `parameters`. With no_decay_norms_and_biases, two parameter groups: weight
    matrices and embeddings (2+ dimensions) decay; norm scales and biases (1 dimension) do not, as they set a
    scale or an offset, which decay would only pull towards 0. Both groups always exist (one may be empty), so
    every pipeline stage's optimizer has the same groups as the single-device one. Under model_parallel each group
    is split by placement (see `by_placement`), and the groups of shards step with foreach kernels, not fused."""
    parameters = list(parameters)
    groups = [{"params": parameters}]
    if no_decay_norms_and_biases:
        decay = [param for param in parameters if param.ndim >= 2]
        no_decay = [param for param in parameters if param.ndim < 2]
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    built = optimizer([part for group in groups for part in by_placement(group)])
    for group in built.param_groups:
        if group.get("fused") and any(isinstance(param, DTensor) for param in group["params"]):
            # Shards (model_parallel) step with the foreach kernels: not every fused kernel takes DTensors (torch
            # 2.13 has no sharding rule for SGD's), every foreach one does.
            group.update(fused=False, foreach=True)
    return built


def by_placement(group: dict[str, Any]) -> list[dict[str, Any]]:
    """`group` as one group per kind of parameter: plain tensors, and the shards (DTensors) of each device mesh.
    The fused and foreach optimizer kernels (model.optimizer.fused) run group by group and refuse a mix, as
    tensor parallelism makes one (sharded blocks, plain first and last layers). One kind: `group` as it is."""
    kinds: dict[Any, list[nn.Parameter]] = {}
    for param in group["params"]:
        kinds.setdefault(param.device_mesh if isinstance(param, DTensor) else None, []).append(param)
    if len(kinds) < 2:
        return [group]
    return [{**group, "params": params} for params in kinds.values()]


def warmup(optimizer: torch.optim.Optimizer, warmup_steps: int) -> LinearLR:
    """The learning rate rising linearly from lr / warmup_steps at the first step to lr at step warmup_steps,
    then constant (warmup_steps=0: constant from the start). A warmup longer than the training is not shortened:
    the training then ends before the learning rate reaches lr, as the settings say."""
    return LinearLR(optimizer, start_factor=1 / warmup_steps if warmup_steps else 1.0, total_iters=warmup_steps)


def constant(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0) -> LRScheduler:
    """scheduler=constant: model.optimizer.lr throughout, after an optional linear warmup."""
    return spanning(warmup(optimizer, warmup_steps), total_steps)


def cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.1
) -> LRScheduler:
    """scheduler=cosine: linear warmup, then a cosine decay from lr to lr x min_lr_ratio at the last step (each
    parameter group from its own lr to its own floor)."""
    # The decay's first step (step warmup_steps) is at lr, its last (step total_steps - 1, the training's last) at
    # the floor: total_steps - 1 - warmup_steps steps apart.
    decay = CosineToFloor(optimizer, T_max=max(1, total_steps - 1 - warmup_steps), min_lr_ratio=min_lr_ratio)
    # Always both parts, even a warmup of 0 steps or no decay left: the saved state then has one shape, and a
    # checkpoint resumes into a training of another length (which keeps the saved span).
    return spanning(
        SequentialLR(optimizer, [warmup(optimizer, warmup_steps), decay], milestones=[warmup_steps]), total_steps
    )


def spanning(scheduler: LRScheduler, total_steps: int) -> LRScheduler:
    """The schedule, told the optimizer steps it was built for (respan says when a search made them fewer than its
    warmup)."""
    scheduler.total_steps = total_steps
    return scheduler


class CosineToFloor(CosineAnnealingLR):
    """torch's cosine decay, but to a floor of its own for each parameter group (its lr x min_lr_ratio), held once
    the span is over. torch's takes one floor for every group (eta_min): a group with a smaller lr (a backbone
    fine-tuned more gently) would climb towards it. And torch's goes on along the cosine past its span, back up to
    lr: a training resumed with more steps than planned (more epochs, a higher max_steps) keeps the span it saved.
    The same state as torch's (eta_min unused): checkpoints load either way."""

    def __init__(self, optimizer: torch.optim.Optimizer, T_max: int, min_lr_ratio: float) -> None:  # noqa: N803
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, T_max=T_max, eta_min=0.0)

    def get_lr(self) -> list[float]:
        progress = min(self.last_epoch, self.T_max) / self.T_max
        share = self.min_lr_ratio + (1 - self.min_lr_ratio) * (1 + math.cos(math.pi * progress)) / 2
        return [base_lr * share for base_lr in self.base_lrs]

    _get_closed_form_lr = get_lr  # what a scheduler's step(epoch) reads (SequentialLR's at its milestone)


def scale_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Multiply the learning rate that schedules are built from by `factor`: every group's initial_lr (the lr
    if no schedule was built yet) and the optimizer's default. A schedule already
    built keeps its own copy of them: build it again with respan. (Scaling group["lr"] alone would last until
    SequentialLR's milestone, which starts the decay from the unscaled learning rate.)"""
    for group in optimizer.param_groups:
        group["initial_lr"] = group.get("initial_lr", group["lr"]) * factor
        group["lr"] = group["initial_lr"]
    optimizer.defaults["lr"] *= factor


def respan(scheduler: LRScheduler, build: SchedulerFactory, total_steps: int) -> None:
    """Make `scheduler`, not stepped yet, the schedule `build` makes for `total_steps` optimizer steps from the
    optimizer's initial learning rate: for a training whose steps or learning rate changed after the schedule was
    built (the batch-size finder, which runs once the optimizer and schedule exist). In place, its state replaced
    by the new schedule's, so whatever holds it (Lightning's scheduler configs, accelerate's checkpoints) keeps it."""
    for group in scheduler.optimizer.param_groups:
        group["lr"] = group["initial_lr"]  # where a new schedule starts from (LinearLR scales the current lr)
    before = getattr(scheduler, "total_steps", total_steps)  # (a schedule of yours: not told)
    scheduler.load_state_dict(build(scheduler.optimizer, total_steps=total_steps).state_dict())
    scheduler.total_steps = total_steps
    warmup = getattr(build, "keywords", {}).get("warmup_steps", 0)
    if total_steps < before and warmup >= total_steps and int(os.environ.get("RANK", "0")) == 0:
        print(
            f"note: scheduler.warmup_steps={warmup} spans the whole training, now {total_steps} optimizer steps (the "
            f"batch-size search made them fewer than {before}): the "
            "learning rate never leaves its warmup; lower scheduler.warmup_steps",
            file=sys.stderr,
        )


def check_training_length(max_epochs: Any, max_steps: Any, every_n_steps: Any) -> None:
    """Where the training ends (-1 or null: no limit of that kind, as in Lightning), which the schedule spans, and
    how often it saves (0 or null: at epoch ends only): refused in one line rather than a scheduler's traceback or a
    training of no step."""
    for name, value in (("max_epochs", max_epochs), ("max_steps", max_steps)):
        if value is not None and not (is_number(value) and int(value) == value and (value >= 1 or value == -1)):
            raise ConfigError(f"trainer.{name}={value}: give 1 or more, or -1 (null) for no limit of that kind")
    if max_epochs in (None, -1) and max_steps in (None, -1):
        raise ConfigError(
            "trainer.max_epochs and trainer.max_steps set no end (-1 or null), and the learning-rate schedule spans "
            "the training: give either"
        )
    if every_n_steps is not None and not (is_number(every_n_steps) and int(every_n_steps) == every_n_steps >= 0):
        raise ConfigError(
            f"checkpoint.every_n_steps={every_n_steps}: give 1 or more (a checkpoint every that many steps), or 0 "
            "for epoch ends only"
        )


def total_steps(max_steps: int, max_epochs: int | None, steps_per_epoch: int) -> int:
    """Optimizer steps of the whole training, which the schedule spans: trainer.max_steps, or fewer if the
    epochs end first (as Lightning's Trainer.estimated_stepping_batches counts them)."""
    if max_epochs is None or max_epochs < 0:  # no limit on epochs
        return max_steps
    by_epochs = max_epochs * steps_per_epoch
    return min(max_steps, by_epochs) if max_steps > 0 else by_epochs


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate of the step about to be taken, logged as train/lr: the first parameter group's (the
    template's groups share it; groups of yours with learning rates of their own each follow the schedule)."""
    return optimizer.param_groups[0]["lr"]
