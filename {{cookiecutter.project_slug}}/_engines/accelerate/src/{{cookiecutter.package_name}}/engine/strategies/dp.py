"""dp: nn.DataParallel, one process that scatters each batch over the GPUs of its machine.

One process loads the whole global batch; nn.DataParallel splits it over `trainer.devices` GPUs, runs a
replica of the net on each (threads) and gathers the outputs on the first GPU, where the loss is computed.
Without 2+ GPUs it warns once and runs on one device (the same code path with one replica).
"""

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from accelerate import Accelerator
from omegaconf import DictConfig
from torch import nn

from ...errors import ConfigError
from ...models.activation_checkpointing import DP_REFUSAL as CHECKPOINTING_DP_REFUSAL
from ...models.compilation import DP_REFUSAL
from ...parallel.batchnorm import data_parallel_problem
from ...parallel.layout import Layout
from . import Strategy


class DataParallel(Strategy):
    name = "dp"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.devices = 1
        self.replica_devices: list[torch.device] = []

    def processes(self, launched: int, devices: int) -> int:
        if launched > 1:
            raise ConfigError("strategy=dp is one process: run it with python, not a launcher (or use strategy=ddp)")
        self.devices = devices
        return 1

    def check_layout(self, processes: int, net: nn.Module, cfg: DictConfig) -> None:
        super().check_layout(processes, net, cfg)
        on_gpu = cfg.trainer.accelerator != "cpu" and torch.cuda.is_available()
        if problem := data_parallel_problem(net, min(self.devices, torch.cuda.device_count()) if on_gpu else 1):
            raise ConfigError(f"strategy=dp {problem}")
        if cfg.compile:
            raise ConfigError(DP_REFUSAL)
        if cfg.activation_checkpointing != "none":
            raise ConfigError(CHECKPOINTING_DP_REFUSAL)

    def data_parallel(self, process_index: int, processes: int) -> tuple[int, int]:
        return 1, 0  # one process reads the whole global batch; the scatter splits it

    def prepare(
        self, accelerator: Accelerator, net: nn.Module, optimizer: Callable[..., torch.optim.Optimizer]
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        net, optimizer = super().prepare(accelerator, net, optimizer)
        gpus = min(self.devices, torch.cuda.device_count()) if accelerator.device.type == "cuda" else 0
        if gpus < 2:
            got = f"{gpus} GPU" if accelerator.device.type == "cuda" else f"trainer.devices={self.devices} on the CPU"
            warnings.warn(
                f"strategy=dp replicates over 2 or more GPUs, got {got}: running on one device, {accelerator.device}",
                stacklevel=2,
            )
            return net, optimizer
        # accelerate's prepare made the net's forward an autocast wrapper bound to this (root) module, which the
        # replicas would copy and run on the root's weights: drop it; each replica autocasts itself instead.
        vars(net).pop("forward", None)
        self.replica_devices = [torch.device("cuda", index) for index in range(gpus)]
        return nn.DataParallel(AutocastReplica(net, accelerator.autocast), device_ids=list(range(gpus))), optimizer

    def devices_in_use(self) -> list[torch.device]:
        return self.replica_devices

    def device_layout(self, processes: int) -> Layout:  # replicas in threads of this process, one per GPU
        return Layout(replicas=max(len(self.replica_devices), 1))


class AutocastReplica(nn.Module):
    """What nn.DataParallel replicates: the net, run under the run's autocast (`accelerator.autocast`). Autocast is
    set per thread, and nn.DataParallel's replica threads enter CUDA's autocast without a dtype, i.e. float16: a
    bf16-mixed run would compute in fp16, with no gradient scaler. (Checkpoints save the net itself.)"""

    def __init__(self, net: nn.Module, autocast: Callable[[], AbstractContextManager]) -> None:
        super().__init__()
        self.net, self.autocast = net, autocast

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.autocast():
            return self.net(*args, **kwargs)
