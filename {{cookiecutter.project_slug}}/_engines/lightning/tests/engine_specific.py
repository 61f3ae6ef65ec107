"""What the shared tests need to know about the engine, the Lightning side (the Accelerate project has its own)."""

from pathlib import Path

from hydra.utils import instantiate
from torch import nn

QUIET = ["trainer.enable_progress_bar=false"]  # no progress bar in a test's log
LAST = "checkpoints/last.ckpt"
SHARDED, MODEL = LAST, "state_dict.net."  # where pipeline and model_parallel's parts are, and the net's entries
DDP = ["strategy=ddp", "trainer.devices=2"]  # Lightning starts the second process itself
DDP_LAUNCH = None
MAIN_PORTS = 20000  # the ports this engine's tests give trainings started without a launcher (conftest)
# the search's trial command of a two-process preset, as the wandb sweep file writes it
SWEEP_COMMAND = ["${env}", "${interpreter}", "-m"]
# What this engine alone refuses: (overrides, the one error line). Lightning runs pipeline on one machine itself.
OPTIMIZATION_REFUSALS = [
    (  # shared code (tests/test_model_split.py checks it for both engines), reached here from the command line
        ["strategy=pipeline", "trainer.devices=2", "trainer.accelerator=cpu", "model.net.norm=batch"],
        "strategy=pipeline computes BatchNorm statistics per micro-batch",
    ),
    (  # shared code (tests/test_fsdp.py checks it for both engines); data_parallel_size and tensor_parallel_size
        # "auto": 1 x 2 on one machine of 2.
        ["strategy=model_parallel", "trainer.devices=2", "strategy.replicas=2"],
        "strategy.replicas=2 must divide strategy.data_parallel_size=1 (the 2 processes = data_parallel_size x "
        "strategy.tensor_parallel_size=2): HSDP shards within data_parallel_size / replicas groups and replicates "
        "across the replicas; valid: 1",
    ),
]
STREAMING_REFUSALS = [
    (
        ["data=streaming", "data.dir=SHAPES", "strategy=pipeline", "trainer.devices=2", "trainer.accelerator=cpu"],
        "data=streaming gives each process its own part of the stream",
    ),
]
SEARCH_REFUSALS = []


def optimizer_of(cfg, net: nn.Module):
    """The optimizer the training builds for `net` from this config (no scheduler given: the optimizer alone)."""
    # Imported here: conftest imports this module, and Lightning imported before pytest's logging plugin sets up the
    # root logger's handlers stops its records at the "lightning.pytorch" logger (caplog would see none).
    from {{ cookiecutter.package_name }}.engine.module import Classifier

    return Classifier(net, instantiate(cfg.model.optimizer), cfg.model.no_decay_norms_and_biases).configure_optimizers()


def reset_engine_state() -> None:
    """Forget what building one training left behind in this process (Lightning keeps nothing)."""


# tests/old_layout_run: the links a run folder has that the template cannot ship (its last checkpoint is a file)
OLD_RUN_LINKS: dict[str, str] = {}


def kept_checkpoints(run_dir: Path) -> tuple[list[int], int | None]:
    """The steps of the run's step checkpoints, and the one of its best checkpoint when that is one of them (in
    Lightning it is a file of its own: None)."""
    steps = [int(path.stem.removeprefix("step")) for path in (run_dir / "checkpoints").glob("step*.ckpt")]
    return sorted(steps), None


def step_checkpoint(run_dir: Path, step: int) -> Path:
    """The run's checkpoint of optimizer step `step`."""
    return run_dir / "checkpoints" / f"step{step:06d}.ckpt"


def best_step(run_dir: Path) -> int | None:
    """The step of the run's best checkpoint (best-epochEE-stepN.ckpt), None without one."""
    best = [int(path.stem.rpartition("-step")[2]) for path in (run_dir / "checkpoints").glob("best-*.ckpt")]
    return best[0] if best else None


def launcher_of(preset: str, processes: int) -> list[str] | None:
    """The launcher prefix a preset over `processes` processes needs (None: `python -m`): Lightning starts them."""
    return None
