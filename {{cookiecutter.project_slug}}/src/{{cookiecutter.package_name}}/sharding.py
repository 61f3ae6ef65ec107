"""Model parallelism that needs no training engine: shard a net by its own hooks.

- tensor: `parallelize` shards every block by the plan the model declares (`tensor_parallel_plan()`) over
  the tensor-parallel ranks of a DeviceMesh, and across its data-parallel ranks shards the model with
  FSDP2 `fully_shard`, which also averages the replicas' gradients.
- layers: `place_layer_groups` puts the model's consecutive layer groups (`layer_groups(n)`) on
  consecutive devices of one process and moves activations along.
"""

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
from torch.utils.hooks import RemovableHandle

from .config import ConfigError

MODES = ("tensor", "layers")  # strategy.mode of model_parallel, in both engines


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"strategy.mode={mode!r} is unknown; valid: {', '.join(MODES)}")


def split_hooks(model: nn.Module, hook: str) -> nn.Module:
    """The (sub)module that declares `hook`, e.g. the net inside a LightningModule."""
    found = next((module for module in model.modules() if callable(getattr(module, hook, None))), None)
    if found is None:
        raise ConfigError(f"strategy=model_parallel needs a model with a {hook}() method (see the README)")
    return found


def mesh_sizes(
    data_parallel_size: int | str, tensor_parallel_size: int | str, nodes: int, per_node: int
) -> tuple[int, int]:
    """(data_parallel_size, tensor_parallel_size) for `nodes` x `per_node` processes; "auto" fills in from the
    other size, and both "auto" means tensor parallel inside a node, data parallel across nodes."""
    dp, tp, world = data_parallel_size, tensor_parallel_size, nodes * per_node
    if dp == "auto" and tp == "auto":
        return nodes, per_node
    if dp == "auto":
        return max(world // tp, 1), tp
    if tp == "auto":
        return dp, max(world // dp, 1)
    return dp, tp


def check_tensor_parallel(model: nn.Module, data_parallel_size: int, tensor_parallel_size: int) -> None:
    """Refuse a model that does not divide over the tensor-parallel ranks (or lacks the hooks)."""
    tp = tensor_parallel_size
    net = split_hooks(model, "tensor_parallel_plan")
    if data_parallel_size > 1:
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


def parallelize(net: nn.Module, mesh: DeviceMesh) -> None:
    """Shard `net` in place over a ("data_parallel", "tensor_parallel") mesh; a no-op the second time."""
    if getattr(net, "_parallelized", False):
        return
    tp_mesh, dp_mesh = mesh["tensor_parallel"], mesh["data_parallel"]
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


def default_layer_devices() -> list[str]:
    """Every visible GPU, or two CPU "devices" for trying layer splitting out."""
    count = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(count)] if count > 1 else ["cpu", "cpu"]


def check_layer_split(model: nn.Module, devices: Sequence[torch.device]) -> None:
    try:
        split_hooks(model, "layer_groups").layer_groups(len(devices))
    except ValueError as err:
        raise ConfigError(f"strategy.devices={[str(d) for d in devices]}: {err}") from err


def place_layer_groups(model: nn.Module, devices: Sequence[torch.device]) -> list[RemovableHandle]:
    """Put layer group i on devices[i]; inputs follow the layers, the output comes back to devices[0]
    (where the labels and the loss are). Returns the hooks, to remove before placing again."""
    hooks = []
    net = split_hooks(model, "layer_groups")
    for group, device in zip(net.layer_groups(len(devices)), devices, strict=True):
        for module in group:
            module.to(device)
            hooks.append(module.register_forward_pre_hook(_move_inputs_to(device)))
    hooks.append(net.register_forward_hook(lambda module, args, output: output.to(devices[0])))
    return hooks


def _move_inputs_to(device: torch.device):
    def hook(module: nn.Module, args: tuple) -> tuple:
        return tuple(arg.to(device) if isinstance(arg, torch.Tensor) else arg for arg in args)

    return hook
