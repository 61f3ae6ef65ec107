"""BatchNorm under data parallelism. Each process normalises with the statistics of its own share of the global
batch unless they are synchronised: only then does a ddp run train like one device. On GPUs that is torch's
nn.SyncBatchNorm; elsewhere (CPU processes on gloo) SynchronisedBatchNorm below. The presets that split the model
(model_parallel's tensor mode, pipeline) and dp refuse BatchNorm instead: see split_problem, data_parallel_problem."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import _functional_collectives as collectives

# The refusals' way out: a user's own model has no model.net.norm.
WITHOUT_BATCHNORM = "a model without BatchNorm (the template's nets: model.net.norm=layer)"


class SynchronisedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm (any of 1d, 2d, 3d) whose training-mode statistics are those of the global batch: every process
    all-reduces its per-channel sum and sample count (the global mean), then its per-channel sum of squared
    deviations from that mean (the global biased variance), normalises by them and updates the running statistics
    as torch's BatchNorm does (running_var with the unbiased variance). The all-reduces are autograd-aware, so the
    backward carries every process's share of the gradient through the statistics, as one device's would. Written
    by hand because torch's SyncBatchNorm runs on GPUs only; this one runs wherever torch.distributed does. In eval
    mode, or with one process, it is plain BatchNorm."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of 2+ dimensions (batch, channels, ...), got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        self._check_input_dim(input)
        x, channels = input.float(), input.shape[1]
        dims = [0, *range(2, x.dim())]  # all but the channels
        shape = [1, channels] + [1] * (x.dim() - 2)
        # Autograd-aware (its backward all-reduces the gradient): torch's replacement for the deprecated
        # torch.distributed.nn.functional.all_reduce.
        total = collectives.all_reduce(torch.cat([x.sum(dims), x.new_full((1,), x.numel() / channels)]), "sum",
                                       dist.group.WORLD)  # fmt: skip
        count = total[-1]
        mean = total[:channels] / count
        centred = x - mean.view(shape)
        # Two passes, as torch's BatchNorm: the one-pass E[x^2] - E[x]^2 cancels in float32 where the mean is large
        # against the spread (readings with an offset), to a variance of any sign, and NaN losses.
        squares = collectives.all_reduce((centred * centred).sum(dims), "sum", dist.group.WORLD)
        var = squares / count  # biased: what the batch is normalised by
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach() * count / (count - 1).clamp(min=1))
        out = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        self.num_batches_tracked.add_(1)
        # momentum=None: a cumulative average, as torch's BatchNorm
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased_var.to(self.running_var.dtype), factor)

    @classmethod
    def convert(cls, module: nn.Module) -> nn.Module:
        """`module` with every BatchNorm layer replaced by a SynchronisedBatchNorm holding its parameters and
        running statistics (as nn.SyncBatchNorm.convert_sync_batchnorm does for torch's)."""
        converted = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls | nn.SyncBatchNorm):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
            for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                setattr(converted, name, tensor)  # the same tensors: weight, bias, running statistics
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert(child))
        return converted


def synchronise(net: nn.Module, device_type: str) -> nn.Module:
    """`net` with its BatchNorm layers synchronised over the processes: torch's SyncBatchNorm on CUDA devices
    (fused kernels), SynchronisedBatchNorm elsewhere."""
    if device_type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return SynchronisedBatchNorm.convert(net)


def uses_batchnorm(net: nn.Module) -> bool:
    return any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in net.modules())


def needs_sync(net: nn.Module, processes: int) -> bool:
    """Whether `net`'s BatchNorm layers must be synchronised over `processes` data-parallel processes."""
    return processes > 1 and uses_batchnorm(net)


def synchronised_message(processes: int) -> str:
    return f"BatchNorm layers synchronised across {processes} processes"


def oom_handling_problem(tool: str, splits_batches: bool) -> str:
    """Why the OOM toolkit's `tool` refuses BatchNorm synchronised over the processes, for its one-line refusal
    (the engine adds how to turn the tool off)."""
    why = "its forward is then a collective, which a process out of memory mid-step would leave the others waiting in"
    if splits_batches:
        why += ", and split micro-batches would change its statistics"
    return f"{tool} cannot run with BatchNorm synchronised over the processes ({why}); use {WITHOUT_BATCHNORM}"


def micro_batch_split_problem(policy_key: str) -> str:
    """Why OOM recovery's split policy refuses a net with BatchNorm, synchronised or not, for its one-line refusal:
    the redone step would normalise each micro-batch with its own statistics (another loss than the whole batch's)
    and update the running statistics once per micro-batch."""
    return (
        f"{policy_key}=split cannot keep the optimisation with BatchNorm (each micro-batch would be normalised with "
        f"its own statistics, and the running statistics updated once per micro-batch); use {policy_key}=skip or "
        f"{WITHOUT_BATCHNORM}"
    )


def accumulation_note(net: nn.Module, accumulate: int) -> str | None:
    """Said, not refused, when gradient accumulation meets BatchNorm: a common choice for vision models, but not the
    optimisation of the whole batch in one step (each micro-batch is normalised by its own statistics)."""
    if accumulate > 1 and uses_batchnorm(net):
        return (
            f"note: trainer.accumulate_grad_batches={accumulate} with BatchNorm: each micro-batch is normalised by its "
            "own statistics, so the losses differ from the run without accumulation (docs/optimisation.md)"
        )
    return None


def unsynchronised_note(net: nn.Module, replicas: int) -> str | None:
    """Said, not refused, when ddp's BatchNorm is left unsynchronised (trainer.sync_batchnorm=false): each process
    normalises by its share of the batch, as many vision recipes do, but not as one device would."""
    if replicas > 1 and uses_batchnorm(net):
        return (
            f"note: trainer.sync_batchnorm=false with BatchNorm over {replicas} processes: each normalises by its "
            "share of the global batch, so the losses differ from one device's (docs/optimisation.md)"
        )
    return None


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
    elif preset == "fsdp":
        why = "does not synchronise BatchNorm statistics over its processes"
    else:
        why = "does not synchronise BatchNorm statistics over its replicas nor shard them over tensor-parallel ranks"
    return f"strategy={preset} {why}; use {WITHOUT_BATCHNORM} or strategy=ddp"
