"""What the earlier starts of a training logged to its wandb run, read back from their run files, so that a restart
logs each step once.

Every start of a training (a torchrun restart, a SLURM requeue, the same command again) writes its own run folder
under <run dir>/wandb/ (`offline-run-<time>-<id>/`, online `run-<time>-<id>/`) with a `run-<id>.wandb` file: every
record it logged, online too. wandb has no public reader for these files: this reads the little it needs by hand.

The file is wandb's record log: a 7-byte header (":W&B", a magic number, a version), then 32 KiB blocks of
chunks, each a 7-byte header (checksum, length, type) and a piece of a protobuf `Record`. A start that was killed
leaves its last record half written: reading stops there.
"""

import json
import struct
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32 * 1024, 7
FULL, LAST = 1, 4  # a record in one chunk; the last chunk of a record split over blocks
STEP = "trainer/global_step"  # both engines log the step as a metric
NOT_METRICS = {STEP, "epoch"}  # logged with every row: bookkeeping, not what a row is for


def logged_steps(run_dir: Path, wandb_id: str) -> dict[str, int]:
    """For each metric the wandb run `wandb_id` holds in the run files under <run_dir>/wandb/, the last step it
    was logged at. Call it before this start's wandb run begins (its own file is not an earlier start's)."""
    last: dict[str, int] = {}
    # (not `*-<id>/`: wandb names a second start within the same second `...-<id>-1/`, whose steps were logged again)
    for path in (run_dir / "wandb").glob(f"*run-*-{wandb_id}*/run-{wandb_id}.wandb"):
        for row in history(path):
            for key in row.keys() - NOT_METRICS:
                if STEP in row and not key.startswith("_"):  # _step, _runtime, _timestamp: wandb's own
                    last[key] = max(last.get(key, -1), row[STEP])
    return last


def not_logged_yet(metrics: dict, step: int, logged: dict[str, int]) -> dict:
    """`metrics`, to be logged at `step`, without those an earlier start logged at this step or later (a restart
    trains again the steps after its checkpoint; the resume is exact, so their values are the same). Empty when
    nothing is left but the bookkeeping."""
    kept = {key: value for key, value in metrics.items() if key in NOT_METRICS or step > logged.get(key, -1)}
    return kept if kept.keys() - NOT_METRICS else {}


def history(path: Path) -> Iterator[dict]:
    """The history rows (metric name -> value) in the run file `path`."""
    for record in records(path.read_bytes()):
        if record.WhichOneof("record_type") == "history":
            yield {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}


def records(data: bytes) -> Iterator[wandb_internal_pb2.Record]:
    if data[:4] != b":W&B":
        return
    pos, payload = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # no room for a chunk header at the end of a block: padding
            pos += BLOCK - pos % BLOCK
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        if kind == 0 or pos + length > len(data):  # zeros, or a chunk cut short by a kill
            return
        payload += data[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            try:
                record = wandb_internal_pb2.Record.FromString(payload)
            except DecodeError:  # damaged by a kill
                return
            yield record
            payload = b""
