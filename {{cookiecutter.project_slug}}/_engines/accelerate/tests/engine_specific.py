"""What the shared tests need to know about the engine, the Accelerate side (the Lightning project has its own)."""

from pathlib import Path

from hydra.utils import instantiate
from launchers import accelerate_launch
from torch import nn

from {{ cookiecutter.package_name }}.runtime.optimization import grouped_optimizer

QUIET = ["trainer.enable_progress_bar=false"]  # no progress bar in a test's log
LAST = "checkpoints/last"
SHARDED, MODEL = f"{LAST}/sharded", "model."  # where pipeline and model_parallel's parts are, and the net's entries
DDP = ["strategy=ddp", "trainer.devices=2"]  # started with accelerate launch --num_processes 2
DDP_LAUNCH = accelerate_launch
MAIN_PORTS = 24000  # the ports this engine's tests give trainings started without a launcher (conftest)
# the search's trial command of a two-process preset, as the wandb sweep file writes it
SWEEP_COMMAND = [
    "${env}",
    "accelerate",
    "launch",
    "--config_file",
    "launch/multi_process.yaml",
    "--num_processes",
    "2",
    "-m",
]
OPTIMIZATION_REFUSALS = []
STREAMING_REFUSALS = []
SEARCH_REFUSALS = []


def optimizer_of(cfg, net: nn.Module):
    """The optimizer the training builds for `net` from this config."""
    return grouped_optimizer(instantiate(cfg.model.optimizer), net.parameters(), True)


def reset_engine_state() -> None:
    """Forget the accelerator state that building one training leaves in this process: the next builds its own."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


# tests/old_layout_run: the links a run folder has that the template cannot ship (last -> its newest checkpoint)
OLD_RUN_LINKS = {"checkpoints/last": "step-0000003"}


def kept_checkpoints(run_dir: Path) -> tuple[list[int], int | None]:
    """The steps of the run's step checkpoints, and the one `best` points at (kept besides the newest)."""
    folder = run_dir / "checkpoints"
    steps = sorted(int(path.name.removeprefix("step-")) for path in folder.glob("step-*"))
    best = folder / "best"
    return steps, int(best.readlink().name.removeprefix("step-")) if best.is_symlink() else None


def step_checkpoint(run_dir: Path, step: int) -> Path:
    """The run's checkpoint of optimizer step `step`."""
    return run_dir / "checkpoints" / f"step-{step:07d}"


def best_step(run_dir: Path) -> int | None:
    """The step of the checkpoint `best` points at, None without one."""
    return kept_checkpoints(run_dir)[1]


def launcher_of(preset: str, processes: int) -> list[str] | None:
    """The launcher prefix a preset over `processes` processes needs (None: `python -m`): `accelerate launch`, but
    for ddp_spawn, which spawns its own."""
    return accelerate_launch(processes) if processes > 1 and preset != "ddp_spawn" else None
