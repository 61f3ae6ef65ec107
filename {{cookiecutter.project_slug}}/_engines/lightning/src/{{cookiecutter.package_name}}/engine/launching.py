"""How the Lightning engine's trainings are started: the command the doctor recommends and the bench runs, and
how the search starts each trial. On one machine Lightning starts the processes of every preset itself; across
machines torchrun (or SLURM) starts one per device."""

import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from omegaconf import DictConfig

from ..parallel.launcher import PACKAGE, module_command, multi_node_torchrun

TRAIN = f"{PACKAGE}.train"
DP_GATHERS_OUTPUTS = False  # strategy=dp: the loss is computed on each replica, device 0 gathers no outputs


def train_command(
    preset: str,
    devices: int,
    nodes: int = 1,
    overrides: Sequence[str] = (),
    module: str = "train",
    kind: str | None = None,
) -> list[str]:
    """`python -m <pkg>.<module> strategy=<preset> ...` with the launcher the preset needs; `devices` per node.
    `kind`: the built-in preset a preset file of yours is (parallel/presets.py), whose launcher it takes."""
    target, preset = module_command(module, preset), kind or preset
    if nodes > 1:
        torchrun = multi_node_torchrun(nodes, devices)
        return [*torchrun, *target, f"trainer.devices={devices}", f"trainer.num_nodes={nodes}", *overrides]
    if preset == "single":
        return ["python", *target, *overrides]
    return ["python", *target, f"trainer.devices={devices}", *overrides]


def trial_command(preset: str, processes: int) -> list[str]:
    """The command line that starts one search trial of `preset` over `processes` processes."""
    return [sys.executable, "-m", TRAIN]  # Lightning starts the other processes of any preset itself


def typed_command(preset: str, processes: int) -> list[str]:
    """The same command as a user types it (for best.yaml's header and the wandb sweep)."""
    return ["python", "-m", TRAIN]


def slurm_tasks(preset: str, processes: int) -> int:
    """SLURM tasks of a trial's job: Lightning under SLURM runs one task per process of a multi-process preset (as
    `srun python -m ...` does) and starts none itself."""
    return processes if preset in ("ddp", "fsdp", "model_parallel", "pipeline") else 1


def processes_per_trial(devices: object, preset: str) -> int | None:
    """Devices (one process each) a trial uses; None for "all it is given" (trainer.devices=auto)."""
    return devices if isinstance(devices, int) and devices > 0 else None


def check_trial(cfg: DictConfig, preset: str, processes: int) -> None:
    """The training's own checks of a trial's config, as its trial will start (raises ConfigError)."""
    from .training import prepare  # torch and Lightning: only now, since they take seconds to import

    with quiet_lightning():
        prepare(cfg)


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Without the lines Lightning logs when it builds a trainer (seed, GPU available, ...): in the search's
    output they would describe no training."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
