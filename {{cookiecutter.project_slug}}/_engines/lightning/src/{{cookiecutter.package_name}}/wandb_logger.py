"""Lightning's WandbLogger, made to continue one wandb run across restarts of one training."""

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from .tracking import keep_wandb_run_id, resumed_wandb_run


class ResumingWandbLogger(WandbLogger):
    """Every start of the training in `run_dir` logs to the same wandb run (its id is kept in the run folder; see
    tracking.resumed_wandb_run). Other arguments go to WandbLogger (and from there to wandb.init)."""

    def __init__(self, run_dir: str, **kwargs: Any) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(save_dir=run_dir, **resumed_wandb_run(self.run_dir), **kwargs)

    @property
    def experiment(self) -> Any:
        experiment = super().experiment  # started on first use, on rank 0 only
        if rank_zero_only.rank == 0:
            keep_wandb_run_id(self.run_dir, experiment.id)
        return experiment
