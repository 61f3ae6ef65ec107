"""accelerate's wandb tracker, made to continue one wandb run across restarts of one training."""

from pathlib import Path
from typing import Any

from accelerate.tracking import WandBTracker, on_main_process

from .tracking import keep_wandb_run_id, resumed_wandb_run


class ResumingWandBTracker(WandBTracker):
    """Every start of the training in `run_dir` logs to the same wandb run: its id is kept in the run folder
    (see tracking.resumed_wandb_run). `project` and the other arguments go to wandb.init; the main process
    alone starts the run and logs."""

    def __init__(self, run_dir: str | Path, project: str, **kwargs: Any) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(project, **kwargs)

    @on_main_process
    def start(self) -> None:
        # The id is read now, not when the tracker is made: train.py may have forgotten it since (resume=false).
        self.init_kwargs.update(resumed_wandb_run(self.run_dir))
        super().start()
        keep_wandb_run_id(self.run_dir, self.run.id)
