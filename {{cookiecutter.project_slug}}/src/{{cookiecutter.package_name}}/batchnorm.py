"""BatchNorm under data parallelism. Each process normalises with the statistics of its own share of the global
batch unless they are synchronised (torch.nn.SyncBatchNorm, which all-reduces them in forward and backward):
only then does a ddp run train like one device. torch's SyncBatchNorm runs on GPUs only. The presets that split
the model (model_parallel's tensor mode, pipeline) refuse BatchNorm instead: see split_problem."""

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


def split_problem(net: nn.Module, preset: str) -> str | None:
    """Why a preset that splits the model refuses `net`'s BatchNorm, if it does: pipeline normalises each
    micro-batch on its own, and model_parallel's tensor mode neither synchronises the statistics over its
    data-parallel replicas nor shards them with the features. Either would train unlike one device, silently."""
    if not uses_batchnorm(net):
        return None
    if preset == "pipeline":
        why = "computes BatchNorm statistics per micro-batch, not over the batch as one device does"
    else:
        why = "does not synchronise BatchNorm statistics over its replicas nor shard them over tensor-parallel ranks"
    return f"strategy={preset} {why}; use a model without BatchNorm (model.net.norm=layer) or strategy=ddp"
