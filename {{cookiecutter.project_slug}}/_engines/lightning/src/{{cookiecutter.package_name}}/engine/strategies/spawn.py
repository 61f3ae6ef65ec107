"""strategy=ddp_spawn: what its processes receive from the command's process.

Lightning's ddp_spawn starts its processes with multiprocessing's spawn and hands each the trainer, the module and the
data module by pickling them: a lambda or a generator in a dataset or a net of yours stopped the training at the
start of fit with multiprocessing's traceback, after the run folder and its wandb run were made. Neither Lightning
nor torch checks it beforehand, so it is checked here (the other presets build everything in each process).
"""

import io
import pickle
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError


class _StructurePickler(pickle.Pickler):
    """Pickles the objects around the arrays, not the arrays' data (spawn shares a tensor's memory instead): the check
    costs the same for a dataset of kilobytes or gigabytes."""

    def persistent_id(self, obj: Any) -> int | None:
        return id(obj) if isinstance(obj, torch.Tensor | np.ndarray) else None


def check_picklable(parts: dict[str, Any]) -> None:
    """Refuse, before anything is written, a part of the training (named by its setting) that spawn cannot pickle."""
    for setting, part in parts.items():
        try:
            _StructurePickler(io.BytesIO()).dump(part)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(
                f"strategy=ddp_spawn pickles the training to send it to the processes it starts, and {setting} cannot "
                f"be pickled ({reason}): make it picklable (a function defined at module level, not a lambda; no open "
                "generator or file), or use strategy=ddp, whose processes each build their own"
            ) from None
