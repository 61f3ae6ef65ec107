"""ddp and ddp_spawn: DistributedDataParallel, one process per device; Accelerator.prepare wraps the net.

ddp's processes come from a launcher (accelerate launch, torchrun); ddp_spawn starts them itself from one
command, with accelerate's notebook_launcher (forked processes: nothing may touch CUDA before it).
"""

from collections.abc import Callable

import torch
from accelerate import Accelerator, notebook_launcher
from omegaconf import DictConfig
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ..batchnorm import needs_sync, synchronise, synchronised_message
from ..config import ConfigError, ProcessCrashed
from . import Strategy


class DDP(Strategy):
    name = "ddp"

    def check_layout(self, processes: int, net: nn.Module, cfg: DictConfig) -> None:
        if processes < 2:
            # The trap this guards against: `accelerate launch --cpu --num_processes 2` starts ONE process.
            raise ConfigError(
                "strategy=ddp needs 2+ processes but this is 1; launch it with `accelerate launch --config_file "
                "launch/multi_process.yaml -m {{ cookiecutter.package_name }}.train strategy=ddp` (or torchrun), "
                "or use strategy=ddp_spawn"
            )
        # The net has BatchNorm layers and trainer.sync_batchnorm (set by the preset) asks for it.
        self.sync_batchnorm = cfg.trainer.sync_batchnorm and needs_sync(net, processes)

    def prepare(
        self, accelerator: Accelerator, net: nn.Module, optimizer: Callable[..., torch.optim.Optimizer]
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        if self.sync_batchnorm:
            net = synchronise(net, accelerator.device.type)  # torch's SyncBatchNorm on GPUs, ours on CPU processes
            accelerator.print(synchronised_message(accelerator.num_processes))
        return super().prepare(accelerator, net, optimizer)


class DDPSpawn(DDP):
    name = "ddp_spawn"

    def processes(self, launched: int, devices: int) -> int:
        if launched > 1:
            raise ConfigError("strategy=ddp_spawn starts its own processes: run it with python, not a launcher")
        return devices

    def launch(self, run: Callable[[], None], devices: int) -> None:
        try:
            notebook_launcher(run, num_processes=devices)
        except ChildFailedError as err:
            # The launcher has already logged the process's traceback; its own report would repeat it.
            rank, failure = err.get_first_failure()
            record = failure.message  # the process's error record: {"message": "<Error>: ...", ...} or a text
            text = record.get("message", "") if isinstance(record, dict) else record
            raise ProcessCrashed(rank, str(text) or f"exit code {failure.exitcode}") from None
