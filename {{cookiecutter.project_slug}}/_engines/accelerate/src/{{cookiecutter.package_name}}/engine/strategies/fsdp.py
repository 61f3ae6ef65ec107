"""fsdp: FSDP2 over every launched process: each holds a shard of every weight, gradient and optimizer state, and
gathers one layer's weights at a time for its compute (the units are the layers of the model's Split; a model
without one is one unit). model_parallel's tensor mode with a tensor-parallel size of 1 (model_parallel.py: torch's
fully_shard, which also runs on CPU/gloo, where Accelerate's FSDP plugin needs GPUs), plus what only FSDP has: HSDP
(`replicas`), keeping gathered weights from forward to backward, and CPU offload (sharding.FsdpSettings).
"""

import os
from typing import Any

from omegaconf import DictConfig
from torch import nn

from ...errors import ConfigError
from ...parallel.sharding import FsdpSettings, check_fsdp, check_precision
from .model_parallel import ModelParallel


class Fsdp(ModelParallel):
    name = "fsdp"

    def __init__(
        self, replicas: int = 1, reshard_after_forward: bool = True, offload: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(mode="tensor", tensor_parallel_size=1, data_parallel_size="auto", **kwargs)
        self.fsdp = FsdpSettings(replicas, reshard_after_forward, offload)

    def processes(self, launched: int, devices: int) -> int:
        if launched == 1 and (devices > 1 or "ACCELERATE_MIXED_PRECISION" in os.environ):
            # One process where several were meant: trainer.devices=N (or SLURM's tasks) without a launcher, or
            # `accelerate launch --cpu --num_processes N`, which starts one. python -m alone shards over one.
            asked = f"{devices} devices" if devices > 1 else "accelerate launch (--cpu starts one process)"
            raise ConfigError(
                f"strategy=fsdp over {asked} needs a process each but this is 1; launch them with `accelerate launch "
                "--config_file launch/multi_process.yaml --num_processes N -m {{ cookiecutter.package_name }}.train "
                "strategy=fsdp`, or run python -m for fsdp over one process (trainer.devices=1)"
            )
        self.sizes = (launched, 1)
        return launched

    def check_layout(self, processes: int, net: nn.Module, cfg: DictConfig) -> None:
        check_precision(self.name, cfg.trainer.precision)
        self.precision = cfg.trainer.precision
        check_fsdp(net, processes, self.fsdp)
