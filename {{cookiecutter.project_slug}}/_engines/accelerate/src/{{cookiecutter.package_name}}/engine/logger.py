"""accelerate's wandb tracker, made to continue one wandb run across restarts of one training."""

from pathlib import Path
from typing import Any

from accelerate.tracking import WandBTracker, on_main_process

from ..tracking.metrics_file import MetricsFile
from ..tracking.wandb_files import STEP, logged_steps, not_logged_yet
from ..tracking.wandb_run import keep_wandb_run_id, resumed_wandb_run


class ResumingWandBTracker(WandBTracker):
    """Every start of the training in `run_dir` logs to the same wandb run (its id is kept in the run folder; see
    tracking.resumed_wandb_run), each step once: a restart does not log again what an earlier start logged, and logs
    what a hard kill kept from the run files (tracking/metrics_file.py).
    `project` and the other arguments go to wandb.init; the main process alone starts the run and logs."""

    def __init__(self, run_dir: str | Path, project: str, **kwargs: Any) -> None:
        self.run_dir = Path(run_dir)
        self.logged: dict[str, int] = {}  # by the earlier starts: metric -> last step
        self.service_lost = False  # wandb's service process stopped (SLURM signals it too): rows go to the file only
        super().__init__(project, **kwargs)

    @on_main_process
    def start(self) -> None:
        # The id is read now, not when the tracker is made: the training may have forgotten it since (resume=false).
        self.init_kwargs.update(resumed_wandb_run(self.run_dir))
        self.logged = logged_steps(self.run_dir, self.init_kwargs["id"])  # before this start's own run file
        super().start()
        keep_wandb_run_id(self.run_dir, self.run.id)
        self.metrics_file = MetricsFile(self.run_dir)
        for step, metrics in self.metrics_file.missing_from(self.logged):  # lost by a hard kill of a start
            super().log({STEP: step, **metrics})
            self.logged.update(dict.fromkeys(metrics, step))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if STEP in values:
            self.metrics_file.append(values, values[STEP])
            values = not_logged_yet(values, values[STEP], self.logged)
        if values and not self.service_lost:
            try:
                super().log(values, step=step, **kwargs)
            except ConnectionError:  # the next start logs what the wandb files lack; finish_wandb says so
                self.service_lost = True
