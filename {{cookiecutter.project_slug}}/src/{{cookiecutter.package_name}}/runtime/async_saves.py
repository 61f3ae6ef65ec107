"""checkpoint.async=true: the parts every process writes of a sharded checkpoint (fsdp, model_parallel, pipeline) go
to disk through torch.distributed.checkpoint's async_save, so the step does not wait on the disk: the state is
copied to host memory, then written by a thread while training goes on. The engines point `last` at a checkpoint
only once it is written (`finished`), so a kill during an async save leaves `last` on the previous, complete one."""

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ..errors import ConfigError


def check_async(enabled: bool, preset: str, writes_parts: bool) -> None:
    """Refuse checkpoint.async where there is no sharded checkpoint to write in the background (in one line)."""
    if enabled and not writes_parts:
        raise ConfigError(
            f"checkpoint.async=true writes the parts each process holds of a sharded checkpoint (strategy=fsdp, "
            f"model_parallel over several processes, pipeline); strategy={preset} here saves the whole model from one "
            "process: give checkpoint.async=false"
        )


class CheckpointWriter:
    """Writes a state dict of this process's parts into a checkpoint folder (every process calls it), at once or, if
    `background`, through async_save: one write in flight at a time (a new one waits for the previous)."""

    def __init__(self, background: bool = False) -> None:
        self.background = background
        self._future: Future | None = None
        self._group: Any = None

    def write(self, state: dict[str, Any], folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)  # at once: the first process writes files of its own beside
        if not self.background:
            dcp.save(state, checkpoint_id=folder)
            return
        self.finished(wait=True)
        if self._group is None:  # its own gloo group: the writing thread's collectives run beside the training's
            self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._future = dcp.async_save(state, checkpoint_id=folder, process_group=self._group)

    def finished(self, wait: bool = False) -> bool:
        """Whether the write in flight has just ended (then it is no longer in flight); with `wait`, after waiting for
        it. False when none was in flight. The first process's write ends after every process's part is written (it
        writes the folder's metadata last), so its answer holds for the whole checkpoint."""
        if self._future is None or not (wait or self._future.done()):
            return False
        future, self._future = self._future, None
        future.result()  # what the writing thread raised, raised here
        return True

    @property
    def in_flight(self) -> bool:
        return self._future is not None
