"""Read an offline wandb run back from its `.wandb` files (wandb has no public reader for them).

A training restarted (torchrun restart, SLURM requeue, same command again) resumes its wandb run: offline, each
start writes one more `offline-run-*-<id>` folder with the same run id (`wandb sync <run dir>/wandb` uploads them
in order, as one run). They are read back as one run, the starts' histories one after the other; a metric logged
twice at one step (a restart logging again a step that an earlier start logged) fails the reading.

The file is a record log: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
chunks, each with a 7-byte header (crc32, length, type) and a slice of a protobuf `Record`.
"""

import json
import struct
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    path: Path  # the first start's file
    id: str = ""
    starts: int = 1  # how many times the training started (1 + restarts)
    group: str = ""
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    exit_code: int | None = None

    def metric(self, key: str) -> list[float]:
        return [row[key] for row in self.history if key in row]

    def steps(self, key: str) -> list[int]:
        return [row["trainer/global_step"] for row in self.history if key in row]


def records(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    pos, payload = CHUNK_HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # block trailer too small for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if kind == 0:
            break
        pos += CHUNK_HEADER
        payload += data[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            yield wandb_internal_pb2.Record.FromString(payload)
            payload = b""


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_run(path: Path) -> OfflineRun:
    run = OfflineRun(path, id=path.stem.removeprefix("run-"))  # run-<id>.wandb; a killed start may lack its header
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.group = record.run.run_group
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    """Every wandb run written under <run_dir>/wandb/ (a training must write exactly one), its starts merged.
    Fails if a metric appears twice at one step."""
    runs: dict[str, OfflineRun] = {}
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):  # folder names start with the time
        start = read_run(path)
        if start.id not in runs:
            runs[start.id] = start
            continue
        run = runs[start.id]
        run.starts += 1
        run.config.update(start.config)
        run.history += start.history
        run.exit_code = start.exit_code
    for run in runs.values():
        steps = [row for row in run.history if "trainer/global_step" in row]
        logged = Counter((key, row["trainer/global_step"]) for row in steps for key in row if is_metric(key))
        twice = sorted(entry for entry, count in logged.items() if count > 1)
        assert not twice, f"wandb run {run.id} in {run_dir}: logged twice (metric, step): {twice}"
    return list(runs.values())


def is_metric(key: str) -> bool:
    return not key.startswith("_") and key not in ("epoch", "trainer/global_step")


def sync_dry_run(run_dir: Path, env: dict[str, str]) -> str:
    """What the README's upload command, `wandb sync <run dir>/wandb`, would upload: its --dry-run's output."""
    env = {name: value for name, value in env.items() if name != "WANDB_SILENT"}  # silent also hides the list
    command = [sys.executable, "-m", "wandb", "sync", "--dry-run", str(run_dir / "wandb")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout + done.stderr
