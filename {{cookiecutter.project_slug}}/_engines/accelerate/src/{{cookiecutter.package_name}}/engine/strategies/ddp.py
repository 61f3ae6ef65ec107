"""ddp and ddp_spawn: DistributedDataParallel, one process per device; Accelerator.prepare wraps the net.

ddp's processes come from a launcher (accelerate launch, torchrun); ddp_spawn starts them itself from one
command, with accelerate's notebook_launcher (forked processes: nothing may touch CUDA before it).
"""

import logging
import os
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, launchers, notebook_launcher
from accelerate.utils import DistributedDataParallelKwargs
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch import nn
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ...errors import ConfigError, Interrupted, TrainingStopped, spawned_failure
from ...parallel.batchnorm import needs_sync, synchronise, synchronised_message
from ...parallel.launcher import free_port
from ...runtime.interrupt import continuing
from . import Strategy


class DDP(Strategy):
    name = "ddp"
    # torch's DistributedDataParallel's options that accelerate passes on (DistributedDataParallelKwargs), taken as
    # `+strategy.static_graph=true` as the Lightning engine's DDPStrategy takes them (config/settings.passed_on)
    passed_on = ("broadcast_buffers", "bucket_cap_mb", "check_reduction", "gradient_as_bucket_view", "static_graph")

    def __init__(
        self, timeout: timedelta = timedelta(minutes=10), find_unused_parameters: bool = False, **ddp_options: Any
    ) -> None:
        super().__init__(timeout)
        self.ddp_options = {"find_unused_parameters": find_unused_parameters, **ddp_options}

    def accelerator_kwargs(self) -> dict[str, Any]:
        kwargs = super().accelerator_kwargs()
        kwargs["kwargs_handlers"].append(DistributedDataParallelKwargs(**self.ddp_options))
        return kwargs

    def check_layout(self, processes: int, net: nn.Module, cfg: DictConfig) -> None:
        # (One process trains as single does, noted by check_config, as in the Lightning engine.)
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
        if devices == 1:  # (noted by check_config: it trains as single does, in this process)
            run()
            return
        # The launcher logs a failed process's traceback, wrapped in its own; this command reports it instead (an
        # out-of-memory stop or a refusal in one line, a crash with the process's traceback).
        launcher_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
        level = launcher_log.level
        launcher_log.setLevel(logging.CRITICAL)
        try:
            # A free port unless MASTER_PORT names one: accelerate's default, 29500, is taken by any other
            # ddp_spawn training on this machine (Lightning's ddp_spawn picks a free one too).
            port = os.environ.get("MASTER_PORT") or str(free_port())
            # Its own line says "Launching training on N CUDAs." on any machine (accelerate 1.15 names CUDA when it
            # finds no other accelerator): this one says what starts.
            launchers.print = lambda *args, **kwargs: None
            print(f"strategy=ddp_spawn: starting {devices} processes")
            notebook_launcher(run, num_processes=devices, use_port=port)
        except SignalException as err:  # Ctrl-C (or SIGTERM) reached this command: its processes stopped at once
            run_dir = Path(HydraConfig.get().runtime.output_dir)
            raise Interrupted(
                f"{signal.Signals(err.sigval).name}: the {devices} processes stopped at once (ddp_spawn's processes "
                f"save no checkpoint on a stop): {continuing(run_dir.name, run_dir)}"
            ) from None
        except ChildFailedError as err:
            rank, failure = err.get_first_failure()
            if failure.exitcode < 0:  # killed (kill -9, the OOM killer): no traceback to report
                run_dir = Path(HydraConfig.get().runtime.output_dir)
                stopped = f"training process {rank} was killed by {failure.signal_name()}"
                raise TrainingStopped(f"{stopped}: {continuing(run_dir.name, run_dir)}") from None
            record = failure.message  # the process's error record: {"message": "<Error>: ...", "extraInfo": ...}
            if isinstance(record, dict):
                record = record.get("extraInfo", {}).get("py_callstack") or record.get("message", "")
            raise spawned_failure(rank, str(record) or f"exit code {failure.exitcode}") from None
        finally:
            launcher_log.setLevel(level)
            vars(launchers).pop("print", None)  # its print is the builtin again (a notebook may launch more)
