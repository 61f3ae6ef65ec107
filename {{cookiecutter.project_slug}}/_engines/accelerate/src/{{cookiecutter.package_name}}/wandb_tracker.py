"""accelerate's wandb tracker, made to continue one wandb run across restarts of one training."""

from pathlib import Path
from typing import Any

from accelerate.tracking import WandBTracker, on_main_process

from .tracking import LoggedSteps, keep_wandb_run_id, wandb_run_id

STEP = "trainer/global_step"  # the loop logs its step as this metric, as Lightning's WandbLogger does


class ResumingWandBTracker(WandBTracker):
    """Every start of the training in `run_dir` logs to the same wandb run (its id is kept in the run folder),
    and a start resumed from a checkpoint skips the steps that the run already has (see tracking.LoggedSteps).
    `project` and the other arguments go to wandb.init; the main process alone starts the run and logs."""

    def __init__(self, run_dir: str | Path, project: str, **kwargs: Any) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(project, id=wandb_run_id(self.run_dir), resume="allow", **kwargs)
        self.logged_steps = LoggedSteps(self.run_dir)

    @on_main_process
    def start(self) -> None:
        super().start()
        keep_wandb_run_id(self.run_dir, self.run.id)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if STEP not in values:  # every row of the loop has its step (train.py's `log`); a row without one is new
            return super().log(values, step, **kwargs)
        metrics = self.logged_steps.unlogged({key: value for key, value in values.items() if key != STEP}, values[STEP])
        if metrics:
            super().log({**metrics, STEP: values[STEP]}, **kwargs)
            self.logged_steps.record(metrics, values[STEP])
