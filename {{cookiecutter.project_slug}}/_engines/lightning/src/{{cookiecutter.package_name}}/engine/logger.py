"""Lightning's WandbLogger, made to continue one wandb run across restarts of one training."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from ..tracking.metrics_file import MetricsFile
from ..tracking.wandb_files import logged_steps, not_logged_yet
from ..tracking.wandb_run import keep_wandb_run_id, resumed_wandb_run
from .lightning_private import drop_anonymous, wandb_attached, wandb_run_id, wandb_started


class ResumingWandbLogger(WandbLogger):
    """Every start of the training in the run folder `dir` logs to the same wandb run (its id is kept in the run
    folder; see tracking.resumed_wandb_run), each step once: a restart does not log again what an earlier start
    logged, and logs what a hard kill kept from the run files (tracking/metrics_file.py). Other arguments go to
    WandbLogger (and from there to wandb.init)."""

    def __init__(self, dir: str, **kwargs: Any) -> None:  # wandb.init's name, as in the Accelerate engine
        self.run_dir = Path(dir)
        self.logged: dict[str, int] = {}  # by the earlier starts: metric -> last step
        self.service_lost = False  # wandb's service process stopped (SLURM signals it too): rows go to the file only
        super().__init__(save_dir=dir, **resumed_wandb_run(self.run_dir), **kwargs)
        drop_anonymous(self)

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the logger; Lightning's __getstate__ first calls wandb.require("service"), a no-op in
        # this wandb that prints a warning in every process. Lightning's, without that call.
        import wandb

        require, wandb.require = wandb.require, lambda *features: None
        try:
            return super().__getstate__()
        finally:
            wandb.require = require

    @property
    def experiment(self) -> Any:
        # (a process ddp_spawn started continues its command's start: that read the run files, and the rows the
        # fit's processes logged may still be on their way to the run file when the test's processes start)
        starting = not wandb_started(self) and not wandb_attached(self) and rank_zero_only.rank == 0
        if starting:  # before this start writes its own run file
            self.logged = logged_steps(self.run_dir, wandb_run_id(self))
        experiment = super().experiment  # started on first use, on rank 0 only
        if starting:
            keep_wandb_run_id(self.run_dir, experiment.id)
            self.metrics_file = MetricsFile(self.run_dir)
            for step, metrics in self.metrics_file.missing_from(self.logged):  # lost by a hard kill of a start
                super().log_metrics(metrics, step)
                self.logged.update(dict.fromkeys(metrics, step))
        return experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.experiment  # noqa: B018 (started first: it reads what the earlier starts logged)
        if step is not None:
            self.metrics_file.append(dict(metrics), step)
            metrics = not_logged_yet(dict(metrics), step, self.logged)
        if metrics and not self.service_lost:
            try:
                super().log_metrics(metrics, step)
            except ConnectionError:  # the next start logs what the wandb files lack; finish_wandb says so
                self.service_lost = True
