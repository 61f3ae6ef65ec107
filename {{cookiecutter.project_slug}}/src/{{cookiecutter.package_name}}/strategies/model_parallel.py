"""model_parallel: split the model itself over devices, for models too big for one device's memory.

Two modes, chosen by `strategy.mode`:

- tensor: Lightning's ModelParallelStrategy. The processes form a 2D DeviceMesh
  (data_parallel x tensor_parallel). Each tensor-parallel group shards every block by the plan the model
  declares (`tensor_parallel_plan()`) and reads the same batch; across data-parallel groups the model is
  also sharded with FSDP2 `fully_shard`, which averages the gradients of the replicas.
- layers: one process, the model cut into consecutive groups of layers (`layer_groups(n)`), group i
  on device i; activations are copied from one device to the next. Simple, but only one device works
  at a time (the pipeline preset overlaps them).
"""

from datetime import timedelta
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy, SingleDeviceStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
from torch.utils.hooks import RemovableHandle

from ..config import ConfigError

MODES = ("tensor", "layers")


def model_parallel(
    mode: str = "tensor",
    tensor_parallel_size: int | Literal["auto"] = "auto",
    data_parallel_size: int | Literal["auto"] = "auto",
    save_distributed_checkpoint: bool = True,
    devices: list[str] | None = None,
    timeout: timedelta = timedelta(minutes=10),
) -> "TensorParallelStrategy | LayerSplitStrategy":
    """The preset's `_target_`: one strategy per mode. Settings of the other mode are ignored."""
    if mode == "tensor":
        return TensorParallelStrategy(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=save_distributed_checkpoint,
            timeout=timeout,
        )
    if mode == "layers":
        return LayerSplitStrategy(devices)
    raise ValueError(f"strategy.mode={mode!r} is unknown; valid: {', '.join(MODES)}")


def split_hooks(model: nn.Module, hook: str) -> nn.Module:
    """The (sub)module that declares `hook`, e.g. the net inside the LightningModule."""
    found = next((module for module in model.modules() if callable(getattr(module, hook, None))), None)
    if found is None:
        raise ConfigError(f"strategy=model_parallel needs a model with a {hook}() method (see the README)")
    return found


class TensorParallelStrategy(ModelParallelStrategy):
    """ModelParallelStrategy that knows its data-parallel layout before the processes start."""

    def _sizes(self) -> tuple[int, int]:
        """(data_parallel_size, tensor_parallel_size); "auto" fills in from the other and the world size."""
        dp, tp = self._data_parallel_size, self._tensor_parallel_size
        if dp == "auto" and tp == "auto":
            return self.num_nodes, self.num_processes  # tensor parallel inside a node, data parallel across
        if dp == "auto":
            return max(self.world_size // tp, 1), tp
        if tp == "auto":
            return dp, max(self.world_size // dp, 1)
        return dp, tp

    @property
    def data_parallel_size(self) -> int:
        return self._sizes()[0]

    @property
    def tensor_parallel_size(self) -> int:
        return self._sizes()[1]

    @property
    def data_parallel_rank(self) -> int:
        # The mesh is laid out row-major: ranks 0..tp-1 form data-parallel group 0, and so on.
        return self.global_rank // self.tensor_parallel_size

    def setup_environment(self) -> None:
        self._data_parallel_size, self._tensor_parallel_size = self._sizes()
        super().setup_environment()

    def check_layout(self, trainer: L.Trainer, model: nn.Module, global_batch_size: int) -> None:
        """Refuse a mesh that does not fit the processes or a model that does not divide over it."""
        dp, tp = self._sizes()
        if dp < 1 or tp < 1 or dp * tp != self.world_size:
            raise ConfigError(
                f"strategy.data_parallel_size={dp} x strategy.tensor_parallel_size={tp} must equal the processes: "
                f"trainer.devices={self.num_processes} x trainer.num_nodes={self.num_nodes} = {self.world_size}"
            )
        net = split_hooks(model, "tensor_parallel_plan")
        if dp > 1:
            split_hooks(model, "layer_groups")  # the FSDP units
        for pattern, style in net.tensor_parallel_plan().items():
            for name, layer in net.named_modules():
                if not (isinstance(layer, nn.Linear) and _matches(name, pattern)):
                    continue
                colwise = isinstance(style, ColwiseParallel)  # colwise splits outputs, rowwise splits inputs
                features, side = (layer.out_features, "output") if colwise else (layer.in_features, "input")
                if features % tp:
                    raise ConfigError(
                        f"{name} has {features} {side} features, which strategy.tensor_parallel_size={tp} does not "
                        f"divide; use a tensor_parallel_size that divides {features}"
                    )

    def parallelize(self, net: nn.Module) -> None:
        """Shard `net` in place (called from LightningModule.configure_model); a no-op the second time."""
        if getattr(net, "_parallelized", False):
            return
        tp_mesh, dp_mesh = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
        if tp_mesh.size() > 1:
            parallelize_module(net, tp_mesh, net.tensor_parallel_plan())
        if dp_mesh.size() > 1:
            # FSDP2 over the data-parallel replicas: it shards weights, gradients and optimizer state, and
            # averages the gradients. One unit per layer, so only one layer's weights are gathered at a time.
            for layer in net.layer_groups(1)[0]:
                fully_shard(layer, mesh=dp_mesh)
            fully_shard(net, mesh=dp_mesh)
        net._parallelized = True


def _matches(name: str, pattern: str) -> bool:
    parts, wanted = name.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(w == "*" or w == p for p, w in zip(parts, wanted, strict=True))


class LayerSplitStrategy(SingleDeviceStrategy):
    """One process; layer group i of the model lives on devices[i]. The batch and the loss live on devices[0]."""

    data_parallel_size = 1
    data_parallel_rank = 0

    def __init__(self, devices: list[str] | None = None) -> None:
        if devices is None:  # every visible GPU, or two CPU "devices" for trying it out
            count = torch.cuda.device_count()
            devices = [f"cuda:{i}" for i in range(count)] if count > 1 else ["cpu", "cpu"]
        self.devices = [torch.device(device) for device in devices]
        super().__init__(device=self.devices[0])
        self._hooks: list[RemovableHandle] = []

    def check_layout(self, trainer: L.Trainer, model: nn.Module, global_batch_size: int) -> None:
        try:
            split_hooks(model, "layer_groups").layer_groups(len(self.devices))
        except ValueError as err:
            raise ConfigError(f"strategy.devices={[str(d) for d in self.devices]}: {err}") from err

    def model_to_device(self) -> None:
        # Lightning moves the whole module to the root device here (at fit, and again at test);
        # put each layer group back on its own device afterwards.
        super().model_to_device()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        net = split_hooks(self.model, "layer_groups")
        for group, device in zip(net.layer_groups(len(self.devices)), self.devices, strict=True):
            for module in group:
                module.to(device)
                self._hooks.append(module.register_forward_pre_hook(_move_inputs_to(device)))
        # The loss is computed where the labels are: bring the output back to the first device.
        self._hooks.append(net.register_forward_hook(lambda module, args, output: output.to(self.devices[0])))

    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        # Lightning moved the optimizer state to the root device; it belongs with its parameter.
        for optimizer in self.optimizers:
            for param, state in optimizer.state.items():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        state[key] = value.to(param.device)


def _move_inputs_to(device: torch.device):
    def hook(module: nn.Module, args: tuple) -> tuple:
        return tuple(arg.to(device) if isinstance(arg, torch.Tensor) else arg for arg in args)

    return hook
