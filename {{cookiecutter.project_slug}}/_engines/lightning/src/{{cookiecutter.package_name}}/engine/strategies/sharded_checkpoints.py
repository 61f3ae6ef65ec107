"""The checkpoint folder of the presets whose processes each hold a part of the model (model_parallel, fsdp, pipeline),
as Lightning's ModelParallelStrategy writes it: every process's parameters and optimizer state by
torch.distributed.checkpoint, the rest (loop counters, callbacks, random states) in meta.pt by the first process.
Written here too so that checkpoint.async=true can write the parts in the background (runtime/async_saves.py)."""

from pathlib import Path
from typing import Any

import torch

from ...runtime.async_saves import CheckpointWriter

META = "meta.pt"  # what Lightning's ModelParallelStrategy names the non-tensor part of its checkpoint folders


def write_parts(checkpoint: dict[str, Any], path: Path, writer: CheckpointWriter, first_process: bool) -> None:
    """Write `checkpoint` (Lightning's dict; its state_dict and optimizer_states are this process's parts) into the
    folder `path`. Every process calls it."""
    if path.is_file():  # a whole-model checkpoint of that name, from another preset
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    parts = {"state_dict": checkpoint.pop("state_dict")}
    parts.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
    writer.write(parts, path)
    if first_process:
        torch.save(checkpoint, path / META)
