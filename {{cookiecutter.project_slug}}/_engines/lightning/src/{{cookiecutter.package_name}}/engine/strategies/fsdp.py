"""fsdp: FSDP2 over every process: each holds a shard of every weight, gradient and optimizer state, and gathers
one layer's weights at a time for its compute (the units are the layers of the model's Split; a model without one is
one unit). The tensor-parallel strategy with a tensor-parallel size of 1 (model_parallel.py), plus what only
FSDP has: HSDP (`replicas`), keeping gathered weights from forward to backward, and CPU offload (sharding.FsdpSettings).
"""

from datetime import timedelta
from typing import Any

import lightning as L
from torch import nn

from ...parallel.sharding import FsdpSettings, check_fsdp, check_init, check_precision
from .model_parallel import TensorParallelStrategy


class FsdpStrategy(TensorParallelStrategy):
    preset = "fsdp"

    def __init__(
        self,
        replicas: int = 1,
        reshard_after_forward: bool = True,
        offload: bool = False,
        init: str = "full",
        timeout: timedelta = timedelta(minutes=10),
        **kwargs: Any,
    ) -> None:
        check_init(init)
        super().__init__(
            init=init,
            data_parallel_size="auto",
            tensor_parallel_size=1,
            timeout=timeout,
            **kwargs,
        )
        self.fsdp = FsdpSettings(replicas, reshard_after_forward, offload)

    def check_layout(self, trainer: L.Trainer, model: nn.Module, global_batch_size: int) -> None:
        check_fsdp(model, self.world_size, self.fsdp)
        check_precision(self.preset, trainer.precision)
