"""<run dir>/metrics.jsonl: every row a training logs, one JSON line each ({"trainer/global_step": S, "train/loss":
...}), besides wandb: the per-step metrics readable without wandb, and what keeps the wandb run whole after a hard
kill of the whole job.

wandb writes its run file from a process of its own, about once a second; a kill of every process at once (a node
failure, the kernel's OOM killer) loses what it had not written, and the start resumed from the checkpoint trains
only the steps after it. This file is written through at once, row by row (a killed process's writes stay with the
operating system), so a resumed start logs to wandb again the rows the run files lack. Written by hand: wandb has no
way to ask what reached its file.
"""

import json
from collections.abc import Iterator
from pathlib import Path

from .wandb_files import STEP, not_logged_yet

METRICS_FILE = "metrics.jsonl"


class MetricsFile:
    """The run's metrics file: the rows the earlier starts wrote, and this start's appended, each step once."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.rows = [json.loads(line) for line in complete_lines(self.path)]
        self.logged = last_steps(self.rows)

    def missing_from(self, logged: dict[str, int]) -> Iterator[tuple[int, dict]]:
        """(step, metrics) of the rows, in order, whose metrics a run holding `logged` (metric -> last step) lacks."""
        for row in self.rows:
            metrics = not_logged_yet({key: value for key, value in row.items() if key != STEP}, row[STEP], logged)
            if metrics:
                yield row[STEP], metrics

    def append(self, metrics: dict, step: int) -> None:
        """Write the row, without what an earlier start wrote at this step or later (a resumed start trains again
        the steps after its checkpoint; the resume is exact, so their values are the same)."""
        kept = not_logged_yet({key: value for key, value in metrics.items() if key != STEP}, step, self.logged)
        if not kept:
            return
        row = {STEP: step, **{key: number(value) for key, value in kept.items()}}
        with open(self.path, "a") as file:  # closed at once: the row is the operating system's
            file.write(json.dumps(row) + "\n")
        self.logged.update(dict.fromkeys(kept, step))


def complete_lines(path: Path) -> list[str]:
    """The file's lines, without a last one cut short by a kill."""
    if not path.is_file():
        return []
    text = path.read_text()
    return text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]


def last_steps(rows: list[dict]) -> dict[str, int]:
    last: dict[str, int] = {}
    for row in rows:
        for key in row.keys() - {STEP}:
            last[key] = max(last.get(key, -1), row[STEP])
    return last


def number(value: object) -> object:
    return value.item() if hasattr(value, "item") else value
