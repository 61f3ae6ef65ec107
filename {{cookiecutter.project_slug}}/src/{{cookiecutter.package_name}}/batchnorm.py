"""BatchNorm under data parallelism. Each process normalises with the statistics of its own share of the global
batch unless they are synchronised (torch.nn.SyncBatchNorm, which all-reduces them in forward and backward):
only then does a ddp run train like one device. torch's SyncBatchNorm runs on GPUs only."""

from torch import nn

from .config import ConfigError


def uses_batchnorm(net: nn.Module) -> bool:
    return any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in net.modules())


def needs_sync(net: nn.Module, processes: int, on_gpu: bool, preset: str) -> bool:
    """Whether `net`'s BatchNorm layers must be synchronised over `processes` data-parallel processes; refuses,
    before training, a run whose BatchNorm cannot be synchronised (on CPU)."""
    if processes < 2 or not uses_batchnorm(net):
        return False
    if not on_gpu:
        raise ConfigError(
            f"strategy={preset}: the model's BatchNorm layers must be synchronised over the {processes} processes to "
            "train like one device, and torch's SyncBatchNorm runs on GPUs only; on CPU use strategy=single, or a "
            "model without BatchNorm (model.net.norm=layer)"
        )
    return True


def synchronised_message(processes: int) -> str:
    return f"BatchNorm layers synchronised across {processes} processes"


def data_parallel_problem(net: nn.Module, replicas: int) -> str | None:
    """Why strategy=dp refuses `net` on `replicas` GPUs, if it does. nn.DataParallel computes BatchNorm statistics
    per GPU and cannot synchronise them (its replicas are threads of one process; SyncBatchNorm needs a process
    per device), so a model with BatchNorm would silently train unlike one device."""
    if replicas > 1 and uses_batchnorm(net):
        return (
            f"cannot synchronise the model's BatchNorm statistics over its {replicas} GPUs (nn.DataParallel); "
            "use strategy=ddp, which does"
        )
    return None
