"""Lightning's WandbLogger, made to continue one wandb run across restarts of one training."""

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from .tracking import LoggedSteps, keep_wandb_run_id, wandb_run_id


class ResumingWandbLogger(WandbLogger):
    """Every start of the training in `run_dir` logs to the same wandb run (its id is kept in the run folder),
    and a start resumed from a checkpoint skips the steps that the run already has (see tracking.LoggedSteps).
    Other arguments go to WandbLogger (and from there to wandb.init)."""

    def __init__(self, run_dir: str, **kwargs: Any) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(save_dir=run_dir, id=wandb_run_id(self.run_dir), resume="allow", **kwargs)
        self.logged_steps = LoggedSteps(self.run_dir)

    @property
    def experiment(self) -> Any:
        experiment = super().experiment  # started on first use, on rank 0 only
        if rank_zero_only.rank == 0:
            keep_wandb_run_id(self.run_dir, experiment.id)
        return experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if step is None:  # Lightning always passes the global step; without one nothing can repeat
            return super().log_metrics(metrics, step)
        metrics = self.logged_steps.unlogged(metrics, step)
        if metrics:
            super().log_metrics(metrics, step)
            self.logged_steps.record(metrics, step)
