"""How the Accelerate engine's trainings are started: the command the doctor recommends and the bench runs, and
how the search starts each trial. One process per device is started by `accelerate launch` on one machine and by
torchrun across machines (or by the training command itself: torchrun.py); single, dp and ddp_spawn run from one
process."""

import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from ..errors import ConfigError, TooFewProcesses
from ..parallel.launcher import PACKAGE, free_port, module_command, multi_node_torchrun
from .torchrun import LAUNCHED_PRESETS

TRAIN = f"{PACKAGE}.train"
LAUNCH_CONFIG = Path("launch/multi_process.yaml")
DP_GATHERS_OUTPUTS = True  # strategy=dp: the replicas' outputs are gathered on device 0, where the loss is computed


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
        return [*torchrun, *target, *overrides]
    if preset == "single":
        return ["python", *target, *overrides]
    if preset not in LAUNCHED_PRESETS:  # one process that splits the batch, or starts the others itself
        return ["python", *target, f"trainer.devices={devices}", *overrides]
    launch = ["accelerate", "launch", "--config_file", str(LAUNCH_CONFIG), "--num_processes", str(devices)]
    return [*launch, *target, *overrides]


def trial_command(preset: str, processes: int) -> list[str]:
    """The command line that starts one search trial of `preset` over `processes` processes (the bench checks with it
    that its points can start)."""
    if preset not in LAUNCHED_PRESETS:
        return [sys.executable, "-m", TRAIN]
    if not LAUNCH_CONFIG.is_file():
        raise ConfigError(f"strategy={preset}'s processes are started with {LAUNCH_CONFIG}: run from the project root")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(LAUNCH_CONFIG)]
    return [*launch, "--num_processes", str(processes), "--main_process_port", str(free_port()), "-m", TRAIN]


def typed_command(preset: str, processes: int) -> list[str]:
    """The same command as a user types it (for best.yaml's header and the wandb sweep)."""
    if preset in LAUNCHED_PRESETS:
        launch = ["accelerate", "launch", "--config_file", str(LAUNCH_CONFIG), "--num_processes", str(processes)]
        return [*launch, "-m", TRAIN]
    return ["python", "-m", TRAIN]


def slurm_tasks(preset: str, processes: int) -> int:
    """SLURM tasks of a trial's job: one, which starts the processes (accelerate launch)."""
    return 1


def processes_per_trial(devices: object, preset: str) -> int | None:
    """Devices (one process each) a trial uses; None for "all it is given" (trainer.devices=auto)."""
    if preset == "single":
        return 1
    return devices if isinstance(devices, int) and devices > 0 else None


def check_trial(cfg: DictConfig, preset: str, processes: int) -> None:
    """The training's own checks of a trial's config, as its trial will start (raises ConfigError)."""
    from .training import check_config  # torch and accelerate: only now, since they take seconds to import

    try:
        check_config(cfg, launched=processes if preset in LAUNCHED_PRESETS else 1)
    except TooFewProcesses as err:  # its advice is about launching the training; the search (bench) launches it
        raise ConfigError(f"{err.what}: give trainer.devices=N, the processes started for each trial") from None
    except ConfigError as err:
        if preset in LAUNCHED_PRESETS:  # the training's advice is about launching it; the search (bench) launches it
            raise ConfigError(f"{err}. Its processes are started for it, trainer.devices={processes} of them") from None
        raise
