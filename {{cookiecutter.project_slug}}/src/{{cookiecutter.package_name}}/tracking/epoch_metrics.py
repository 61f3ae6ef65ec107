"""The file through which a training tells the search its validation metrics, one JSON line per epoch.

A training writes it when `epoch_metrics=<path>` is set (the search sets it for each trial); the search reads
it while the trial runs, to report each epoch to Optuna's pruner. A file, not a connection, so that a trial
can be any process tree (a launcher, several ranks, a SLURM job) and a crashed trial leaves its history.
"""

import json
from pathlib import Path


def append_epoch_metrics(path: str | Path, epoch: int, metrics: dict[str, float], final: bool) -> None:
    """Add one epoch's metrics (main process only), `final`: the last of trainer.max_epochs (the search does not
    prune a trial there: its training is done). One line per write, flushed when the file closes."""
    line = {"epoch": epoch, "final": final, **{name: float(value) for name, value in metrics.items()}}
    with open(path, "a") as file:
        file.write(json.dumps(line) + "\n")


def is_final(epoch: int, max_epochs: int | None, steps: int, max_steps: int | None) -> bool:
    """Whether the training ends after this epoch's validation: its last epoch, or the one that reached max_steps
    (-1 or None: no limit)."""
    return (max_epochs is not None and epoch + 1 == max_epochs) or (max_steps is not None and 0 < max_steps <= steps)


def read_epoch_metrics(path: Path) -> list[dict[str, float]]:
    """The complete lines so far (a line still being written is left for the next read)."""
    if not path.is_file():
        return []
    lines = path.read_text().split("\n")[:-1]  # the text after the last newline is not complete yet
    return [json.loads(line) for line in lines if line]
