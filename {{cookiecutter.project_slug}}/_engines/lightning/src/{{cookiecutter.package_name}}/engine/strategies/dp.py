"""strategy=dp: nn.DataParallel for the Lightning 2.x Trainer, which dropped it (PR #16748).

One process, one thread per GPU: every step the batch is scattered over the GPUs, the model is
replicated onto each, the step runs on every replica and the outputs are gathered on the first GPU.
Lightning's forward redirection always calls the original module, never a replica, so the steps go
through `ReplicaSteps` instead, and what a replica passes to `self.log` is collected and logged once
by the root. Prefer ddp (see configs/strategy/dp.yaml for why); this exists for notebooks and
code that must stay one process.
"""

import threading
from collections import defaultdict
from typing import Any, NamedTuple

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import apply_to_collection, move_data_to_device
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn

from ...errors import ConfigError
from ...models.activation_checkpointing import DP_REFUSAL as CHECKPOINTING_DP_REFUSAL
from ...models.compilation import DP_REFUSAL
from ...parallel.batchnorm import data_parallel_problem
from ...parallel.layout import Layout
from ..lightning_private import set_device

STEP_CONTEXTS = {
    "training_step": "train_step_context",
    "validation_step": "val_step_context",
    "test_step": "test_step_context",
    "predict_step": "predict_step_context",
}


class PerReplica(NamedTuple):
    """A scalar one replica returned, and how many samples it saw. Gathered, these become vectors."""

    value: Tensor
    weight: Tensor


def per_replica(tensor: Tensor, samples: int) -> Tensor | PerReplica:
    """Mark a scalar output, which Gather would only stack, for `reduce_gathered`."""
    if tensor.dim():
        return tensor
    return PerReplica(tensor.reshape(1), torch.tensor([float(samples)], device=tensor.device))


def weighted_mean(gathered: PerReplica) -> Tensor:
    """The scalar over the whole batch: chunks can differ in size (a batch of 10 on 4 GPUs is 3+3+3+1)."""
    weight = gathered.weight / gathered.weight.sum()
    return (gathered.value * weight.to(gathered.value.dtype)).sum()


def reduce_gathered(output: Any) -> Any:
    """Per-replica scalars (the loss) become their batch mean; per-sample tensors stay concatenated."""
    return apply_to_collection(output, PerReplica, weighted_mean)


class ReplicaLogs:
    """What the replicas passed to `self.log` during one step, for the root to log once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # replicas run in threads
        self._values: dict[str, list[PerReplica]] = defaultdict(list)
        self._options: dict[str, dict[str, Any]] = {}

    def recorder(self, samples: int):
        """The `log` a replica gets: records instead of logging from its thread."""

        def log(name: str, value: Any, **options: Any) -> None:
            if not isinstance(value, Tensor | int | float):
                raise TypeError(f"strategy=dp: log {name!r} as a tensor or number, not {type(value).__name__}")
            scalar = torch.as_tensor(value).detach().float().reshape(())
            with self._lock:
                self._values[name].append(per_replica(scalar, samples))
                self._options[name] = options

        return log

    def reduced(self, device: torch.device) -> list[tuple[str, Tensor, dict[str, Any]]]:
        """(name, value over the whole batch, log options) for each logged name, on the root device."""
        logged = []
        for name, parts in self._values.items():
            options = dict(self._options[name])
            gathered = PerReplica(*(torch.cat([getattr(p, f).to(device) for p in parts]) for f in PerReplica._fields))
            reduce_fx = options.get("reduce_fx", "mean")
            reduce_fx = reduce_fx if isinstance(reduce_fx, str) else getattr(reduce_fx, "__name__", "mean")
            across = {"sum": torch.sum, "max": torch.max, "min": torch.min}.get(reduce_fx)
            value = across(gathered.value) if across else weighted_mean(gathered)
            if options.get("batch_size") is not None:  # each replica gave its chunk's size
                options["batch_size"] = int(gathered.weight.sum())
            logged.append((name, value, options))
        return logged


class ReplicaSteps(nn.Module):
    """The module nn.DataParallel replicates: its forward runs a step method of this replica's LightningModule."""

    def __init__(self, module: L.LightningModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, step: str, context, logs: ReplicaLogs, *args: Any, **kwargs: Any) -> Any:
        module = self.module  # in a replica: that replica's shallow copy of the LightningModule
        tensors: list[Tensor] = []
        apply_to_collection((args, kwargs), Tensor, tensors.append)
        samples = len(tensors[0]) if tensors and tensors[0].dim() else 1
        if tensors:
            set_device(module, tensors[0].device)  # a replica copies the root's device; self.device must be its own
        module.log = logs.recorder(samples)  # shadows LightningModule.log on this object only
        try:
            with context():  # autocast is per thread: enter the precision context again inside the replica
                output = getattr(module, step)(*args, **kwargs)
        finally:
            del module.log
        return apply_to_collection(output, Tensor, per_replica, samples)


class DataParallelStrategy(ParallelStrategy):
    """nn.DataParallel over trainer.devices GPUs; with fewer than 2 GPUs it runs on one device."""

    strategy_name = "dp"
    # One process reads the whole global batch; nn.DataParallel scatters it (see data/loading.py).
    data_parallel_size = 1
    data_parallel_rank = 0
    is_distributed = False

    def __init__(self, accelerator=None, parallel_devices=None, checkpoint_io=None, precision_plugin=None) -> None:
        super().__init__(accelerator, parallel_devices, None, checkpoint_io, precision_plugin)
        self.num_nodes = 1  # set by the Trainer

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        if devices and (len(devices) < 2 or devices[0].type != "cuda"):
            kind = "GPU" if devices[0].type == "cuda" else devices[0].type.upper()
            rank_zero_warn(
                f"strategy=dp replicates over 2 or more GPUs, got {len(devices)} {kind} device(s): "
                f"running on one device, {devices[0]}"
            )
            devices = devices[:1]
        self._parallel_devices = devices

    @property
    def devices_in_use(self) -> list[torch.device]:
        return self.parallel_devices or []

    def device_layout(self) -> Layout:  # replicas in threads of this process, one per GPU
        return Layout(replicas=len(self.parallel_devices or [None]))

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0]

    # One process: no ranks, no collectives. Values the root logs are already over the whole batch.
    global_rank = local_rank = node_rank = 0
    world_size = 1

    @property
    def is_global_zero(self) -> bool:
        return True

    @property
    def distributed_sampler_kwargs(self) -> None:
        return None

    def reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor

    def all_gather(self, tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return tensor

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision

    def check_supported(self, model: L.LightningModule) -> None:
        """Refuse, before training, what cannot work on replicas running in threads."""
        problems = [
            f"cannot call {type(model).__name__}.{hook}: nn.DataParallel moves the batch to the GPUs itself"
            for hook in ("transfer_batch_to_device", "on_after_batch_transfer")
            if is_overridden(hook, model)
        ]
        if problem := data_parallel_problem(model, len(self.parallel_devices or [])):
            problems.append(problem)
        if getattr(model, "compile_net", False):
            problems.append(DP_REFUSAL.removeprefix("strategy=dp "))
        if getattr(model, "activation_checkpointing", "none") != "none":
            problems.append(CHECKPOINTING_DP_REFUSAL.removeprefix("strategy=dp "))
        if not model.automatic_optimization:
            problems.append("needs automatic optimization: manual backward and steps would run in every replica")
        if self.num_nodes > 1:
            problems.append(f"runs one process on one node, not trainer.num_nodes={self.num_nodes}; use strategy=ddp")
        if problems:
            raise ConfigError(f"strategy=dp {problems[0]}")

    def check_layout(self, trainer: L.Trainer, module: L.LightningModule, global_batch_size: int) -> None:
        self.check_supported(module)  # before engine/training.py writes anything; connect() checks again for direct use

    def connect(self, model: L.LightningModule) -> None:
        self.check_supported(model)
        super().connect(model)

    def model_to_device(self) -> None:
        self.model.to(self.root_device)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        steps = ReplicaSteps(model)
        if self.root_device.type != "cuda":
            return steps  # one CPU or MPS device: nothing to replicate (nn.DataParallel would just call it)
        return nn.DataParallel(steps, device_ids=[device.index for device in self.parallel_devices])

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        if isinstance(self.model, nn.DataParallel):
            return batch  # scattered from host memory straight to each GPU
        return move_data_to_device(batch, device or self.root_device)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step("training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._step("predict_step", *args, **kwargs)

    def _step(self, step: str, *args: Any, **kwargs: Any) -> Any:
        context = getattr(self.precision_plugin, STEP_CONTEXTS[step])
        logs = ReplicaLogs()
        with context():
            output = self.model(step, context, logs, *args, **kwargs)
        for name, value, options in logs.reduced(self.root_device):
            self.lightning_module.log(name, value, **options)  # once, from the root, after the gather
        return reduce_gathered(output)  # the loss is the batch mean before Lightning calls backward

    def teardown(self) -> None:
        self.model = self.lightning_module  # unwrap: the next fit/test wraps again
        super().teardown()
