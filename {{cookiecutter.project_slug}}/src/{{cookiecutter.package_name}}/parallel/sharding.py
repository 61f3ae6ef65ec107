"""Model parallelism that needs no training engine: shard a net as its `Split` describes (parallel/split.py).

- tensor: `parallelize` shards the net by its split's tensor-parallel plan over the tensor-parallel ranks of
  a DeviceMesh, and across its data-parallel ranks shards it with FSDP2 `fully_shard` (one unit per layer of
  the split), which also averages the replicas' gradients.
- layers: `place_layer_groups` puts the net's consecutive layer groups on consecutive devices of one process
  and moves activations along.

The net is built on the meta device (`OnMeta`), sharded, then `materialize` allocates only this rank's shards and
fills them with the values a normal build draws, so training matches strategy=single: copied from the whole model
built once on the CPU from the same random state (strategy.init=full, any model), or, for a model too big for host
memory, drawn module by module by each one's reset_parameters() (strategy.init=meta). `clip_grad_norm_` clips by
the norm of the whole gradient and `clip_grad_value_` every element, over shards and plain tensors alike.
"""

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parameter import is_lazy
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map_only
from torch.utils.hooks import RemovableHandle

from ..errors import ConfigError
from .batchnorm import split_problem
from .layout import Layout
from .split import (
    RefusedStyle,
    find_split,
    fsdp_units,
    has_split,
    layer_groups,
    matches,
    split_net,
    tensor_parallel_plan,
)

MODES = ("tensor", "layers")  # strategy.mode of model_parallel, in both engines


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"strategy.mode={mode!r} is unknown; valid: {', '.join(MODES)}")


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


def check_tensor_parallel(model: nn.Module, tensor_parallel_size: int, processes: int = 0) -> None:
    """Refuse a model that has no split, or whose tensor-parallel plan does not divide over the tensor-parallel
    ranks: sharded features, and the attention heads of a module whose layers are sharded. `processes` (when
    known): the sizes named as valid divide it too."""
    tp = tensor_parallel_size
    net, split = find_split(model, "model_parallel")
    if problem := split_problem(net, "model_parallel"):
        raise ConfigError(problem)
    fsdp_units(net)  # every layer the split names exists
    if processes and (processes // tp > 1 or tp == 1):  # (parallelize: FSDP2 over the data-parallel replicas)
        check_no_scalar_parameters(net, "model_parallel")
    if tp > 1 and not split.tensor_parallel:  # each of the tp processes would hold and compute the whole model
        raise ConfigError(
            f"strategy.tensor_parallel_size={tp}, but the Split of {type(net).__name__} shards no layer (its "
            "tensor_parallel plan is empty): give it one (docs/your-model.md), or use strategy=fsdp (or "
            "tensor_parallel_size=1) to spread the model over the processes"
        )
    must_divide: list[tuple[str, int]] = []  # (what, its count): every one checked, the valid sizes named at once
    names: dict[nn.Parameter, list[str]] = {}  # every name of each parameter (a tied one has several)
    for other, param in net.named_parameters(remove_duplicate=False):
        names.setdefault(param, []).append(other)
    for pattern, style in split.tensor_parallel.items():
        if isinstance(style, RefusedStyle):
            if tp > 1:
                raise ConfigError(style.reason)
            continue
        layers = [(name, layer) for name, layer in net.named_modules() if matches(name, pattern)]
        if not layers:
            raise ConfigError(f"the Split of {type(net).__name__} names {pattern!r}, which matches no submodule")
        for name, layer in layers:
            if tp > 1 and (tied := _tied_elsewhere(names, name, layer)):
                # torch's parallelize_module gives each sharded layer new parameters of its own: the tie is undone,
                # and the copies trained apart (losses off single's from the second step) in silence
                raise ConfigError(
                    f"{name}.{tied[0]} is tied to {tied[1]} (one parameter), and tensor parallelism gives {name} a "
                    "sharded copy of its own, which would train apart from it: untie them, leave both out of the "
                    "Split's tensor_parallel plan, or use a preset without tensor parallelism (fsdp, ddp, pipeline)"
                )
            if isinstance(style, ColwiseParallel | RowwiseParallel) and not isinstance(layer, nn.Linear | nn.Embedding):
                raise ConfigError(
                    f"the Split of {type(net).__name__} shards {name} ({type(layer).__name__}) with "
                    f"{type(style).__name__}, which torch applies to nn.Linear and nn.Embedding only: make it an "
                    "nn.Linear (a model library's Conv1D is one with its weight transposed), or leave it out of "
                    "the tensor_parallel plan"
                )
            if isinstance(style, ColwiseParallel) and (fused := _fused_parts(net, name, layer)):
                raise ConfigError(
                    f"{name} looks like a fused projection ({fused}): ColwiseParallel gives each rank a contiguous "
                    f"block of its {layer.out_features} outputs, across the fused parts instead of its share of each "
                    "(with q, k and v: rank 0 would get all of q); split it into one nn.Linear per part in the "
                    "model, or leave it out of the tensor_parallel plan"
                )
            if isinstance(style, ColwiseParallel) and (heads := _projected_heads(net, name, layer)):
                outputs = f"({layer.out_features} outputs, head_dim {layer.out_features // heads})"
                must_divide.append((f"{name} projects {heads} attention head{'s' * (heads > 1)} {outputs}", heads))
            sizes = _sharded_sizes(layer, isinstance(style, ColwiseParallel))
            must_divide += [(f"{name} has {count} {what}", count) for what, count in sizes]
        for name, parent in net.named_modules():  # heads split over the ranks must split evenly too
            heads = _head_count(parent)
            if heads and any(not name or layer.startswith(f"{name}.") for layer, _ in layers):
                must_divide.append((f"{name or type(net).__name__} has {heads} attention heads", heads))
    if failing := [what for what, count in must_divide if count % tp]:
        common = math.gcd(*(count for _, count in must_divide))
        valid = f"valid: {_divisors(common)}, which divide every sharded layer's features and the attention heads"
        if processes and math.gcd(common, processes) != common:  # a size must divide the processes as well
            allowed = _divisors(math.gcd(common, processes))
            valid = f"valid with the {processes} processes: {allowed} (the model allows {_divisors(common)})"
        raise ConfigError(f"{failing[0]}, which strategy.tensor_parallel_size={tp} does not divide; {valid}")


def _tied_elsewhere(names: dict[nn.Parameter, list[str]], name: str, layer: nn.Module) -> tuple[str, str] | None:
    """(the parameter's name in `layer`, another of its `names` in the net) for a parameter of the layer `name` that
    the net uses elsewhere too (tied weights), else None."""
    for own, param in layer.named_parameters(recurse=False):
        if others := [other for other in names.get(param, []) if other != f"{name}.{own}"]:
            return own, others[0]
    return None


def _divisors(number: int) -> str:
    """The divisors of `number`, the first six named."""
    divisors = [size for size in range(1, number + 1) if number % size == 0]
    return ", ".join(map(str, divisors[:6])) + (f", ... (the divisors of {number})" if len(divisors) > 6 else "")


HEAD_ATTRIBUTES = ("num_heads", "n_heads", "n_head")  # how attention modules commonly name their head count
# How model libraries name a Linear that computes several projections at once (q/k/v, k/v, gate/up).
FUSED_NAMES = re.compile(r"(^|_)(qkv|wqkv|c_attn|in_proj|query_key_value|kv|kv_proj|gate_up|gate_up_proj|w12)$")


def _fused_parts(net: nn.Module, name: str, layer: nn.Module) -> str:
    """Why `layer` looks like several projections in one (by its name, or in attention by its 3 x dim outputs); ""
    if it does not."""
    if not isinstance(layer, nn.Linear):
        return ""
    if FUSED_NAMES.search(name.rsplit(".", 1)[-1]):
        return f"its name, {name.rsplit('.', 1)[-1]}"
    parent = net.get_submodule(name.rsplit(".", 1)[0]) if "." in name else net
    if _head_count(parent) and layer.out_features == 3 * layer.in_features:
        return f"3 x {layer.in_features} outputs in an attention module: q, k and v"
    return ""


def _projected_heads(net: nn.Module, name: str, layer: nn.Module) -> int:
    """How many heads a Linear inside an attention module with a `head_dim` projects (grouped-query attention: k
    and v fewer than q), 0 for other layers; a colwise split must give each rank whole heads."""
    parent = net.get_submodule(name.rsplit(".", 1)[0]) if "." in name else net
    head_dim = getattr(parent, "head_dim", None)
    if not isinstance(layer, nn.Linear) or not isinstance(head_dim, int) or layer.out_features % head_dim:
        return 0
    heads = layer.out_features // head_dim
    return 0 if heads == _head_count(parent) else heads  # the module's own head count: checked below, by its name


def _head_count(module: nn.Module) -> int:
    return next((getattr(module, a) for a in HEAD_ATTRIBUTES if isinstance(getattr(module, a, None), int)), 0)


def _sharded_sizes(layer: nn.Module, colwise: bool) -> list[tuple[str, int]]:
    """The sizes a colwise (output) or rowwise (input) split cuts, per kind of layer."""
    if isinstance(layer, nn.Linear):
        return [("output features", layer.out_features) if colwise else ("input features", layer.in_features)]
    if isinstance(layer, nn.Embedding):  # colwise splits the embedding dimension, rowwise the vocabulary
        return [("embedding features", layer.embedding_dim) if colwise else ("embeddings", layer.num_embeddings)]
    return []


@dataclass(frozen=True)
class FsdpSettings:
    """strategy=fsdp's options (configs/strategy/fsdp.yaml); model_parallel takes `replicas` (HSDP x tensor parallel)
    and the defaults of the rest."""

    replicas: int = 1  # > 1: HSDP, shards within groups of processes, the groups replicas of each other
    reshard_after_forward: bool = True  # false: a layer's gathered weights stay from its forward to its backward
    offload: bool = False  # parameters, gradients and optimizer state in host memory, the step on the CPU

    def check(self, data_parallel: int, tensor_parallel: int = 1) -> None:
        """Refuse, before training, replicas that do not divide the data-parallel processes, naming each factor."""
        if self.replicas >= 1 and data_parallel % self.replicas == 0:
            return
        valid = ", ".join(str(r) for r in range(1, data_parallel + 1) if data_parallel % r == 0)
        if tensor_parallel == 1:
            raise ConfigError(
                f"strategy.replicas={self.replicas} must divide the {data_parallel} processes: HSDP shards the model "
                f"within {data_parallel} / replicas processes and replicates across the replicas; valid: {valid}"
            )
        raise ConfigError(
            f"strategy.replicas={self.replicas} must divide strategy.data_parallel_size={data_parallel} (the "
            f"{data_parallel * tensor_parallel} processes = data_parallel_size x strategy.tensor_parallel_size="
            f"{tensor_parallel}): HSDP shards within data_parallel_size / replicas groups and replicates across the "
            f"replicas; valid: {valid}"
        )

    def layout(self, data_parallel: int, tensor_parallel: int) -> Layout:
        """model_parallel's and fsdp's layout: the data-parallel processes in `replicas` groups of shards."""
        shards = data_parallel // self.replicas
        return Layout(replicas=self.replicas, shards=shards, tensor_parallel=tensor_parallel)

    def shards_device(self, compute: torch.device) -> torch.device:
        """Where the shards live: host memory under offload (FSDP2 copies each layer's in for its compute)."""
        return torch.device("cpu") if self.offload else compute

    def offload_policy(self) -> OffloadPolicy:
        # Pinned host memory copies to a GPU asynchronously; without one (CPU processes) there is nothing to pin.
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if self.offload else OffloadPolicy()


def check_fsdp(model: nn.Module, processes: int, settings: FsdpSettings) -> None:
    """Refuse, before training, what strategy=fsdp cannot train as one device does."""
    net = split_net(model)
    net = getattr(model, "net", model) if net is None else net  # (not `or`: a Sequential of no layers is falsy)
    if processes > 1 and (problem := split_problem(net, "fsdp")):  # one process: BatchNorm over the whole batch
        raise ConfigError(problem)
    if has_split(net):
        fsdp_units(net)  # every layer the split names exists
    check_no_scalar_parameters(net, "fsdp")
    settings.check(processes)


WRAPPED_BEFORE_THE_FIRST_FORWARD = ("ddp", "ddp_spawn", "fsdp", "model_parallel", "pipeline")


def unsized_parameter(net: nn.Module) -> str | None:
    """The name of the net's first parameter that a lazy module sizes at the first forward (None: all are sized)."""
    return next((name for name, param in net.named_parameters() if is_lazy(param)), None)


def check_sized_parameters(net: nn.Module, preset: str) -> None:
    """A lazy module's parameters (nn.LazyLinear's, ...) get their size at the net's first forward; DDP, FSDP2 and
    the model-splitting presets take the net before it (a traceback in every process after the run folder was
    made). single and dp train it: it is sized in the first step."""
    if preset not in WRAPPED_BEFORE_THE_FIRST_FORWARD:
        return
    if (lazy := unsized_parameter(net)) is not None:
        module = net.get_submodule(lazy.rpartition(".")[0]) if "." in lazy else net
        raise ConfigError(
            f"model.net {type(net).__name__}'s {lazy} ({type(module).__name__}) has no size until the net's first "
            f"forward, and strategy={preset} takes the net before it: give the layer its sizes (nn.Linear(in_features"
            ", ...); the data's are data.num_features), or use strategy=single|dp, which size it at the first step"
        )


def check_no_scalar_parameters(net: nn.Module, preset: str) -> None:
    """FSDP2 refuses a 0-dim parameter (a learned temperature, say) once every process has started: said before."""
    if scalar := next((name for name, param in net.named_parameters() if param.dim() == 0), None):
        raise ConfigError(
            f"strategy={preset} shards the parameters with torch's FSDP2, which cannot shard the 0-dim parameter "
            f"{scalar}: give it one dimension (nn.Parameter(torch.tensor([value])) broadcasts alike), or use "
            "strategy=ddp"
        )


def check_precision(preset: str, precision: str) -> None:
    if precision == "16-mixed":  # fp16's gradient scaler does not work on DTensor shards
        raise ConfigError(f"strategy={preset} supports trainer.precision=32-true or bf16-mixed, not 16-mixed")


def move_buffers(net: nn.Module, device: torch.device) -> None:
    """Buffers to the compute device, parameters left where they are (FSDP2's CPU offload keeps them in host
    memory)."""
    for module in net.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = buffer.to(device)


def parallelize(
    net: nn.Module, mesh: DeviceMesh, precision: str = "32-true", fsdp: FsdpSettings = FsdpSettings()
) -> None:
    """Shard `net` in place over a ("data_parallel", "tensor_parallel") mesh; a no-op the second time."""
    if getattr(net, "_parallelized", False):
        return
    tp_mesh, dp_mesh = mesh["tensor_parallel"], mesh["data_parallel"]
    if fsdp.replicas > 1:
        # HSDP: FSDP2 replicates over a 2-D mesh's first dimension and shards over its second. One mesh (replicate,
        # shard, tensor_parallel) for both, with the ranks where `mesh` has them (row-major): FSDP2 takes a
        # tensor-parallel shard only from a mesh of the same root.
        sizes = (fsdp.replicas, dp_mesh.size() // fsdp.replicas, tp_mesh.size())
        names = ("replicate", "shard", "tensor_parallel")
        root = init_device_mesh(mesh.device_type, sizes, mesh_dim_names=names)
        tp_mesh, dp_mesh = root["tensor_parallel"], root["replicate", "shard"]
    if tp_mesh.size() > 1:
        parallelize_module(net, tp_mesh, tensor_parallel_plan(net, "model_parallel"))
    if dp_mesh.size() > 1 or tp_mesh.size() == 1:
        # FSDP2 over the data-parallel replicas: it shards weights, gradients and optimizer state, and
        # averages the gradients. One unit per layer, so only one layer's weights are gathered at a time
        # (a net without a Split, under strategy=fsdp: one unit, the whole net).
        # On a 1 x 1 mesh (one process) too: its parameters are then DTensors like on any other mesh, which
        # the sharded checkpoints need (Lightning refuses to load one into a model without DTensors).
        options = dict(
            mesh=dp_mesh,
            mp_policy=fsdp_mixed_precision(precision),
            reshard_after_forward=fsdp.reshard_after_forward,
            offload_policy=fsdp.offload_policy(),
        )
        for layer in fsdp_units(net) if has_split(net) else []:
            fully_shard(layer, **options)
        fully_shard(net, **options)
    net._parallelized = True


def fsdp_mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """bf16-mixed: FSDP2 gathers the weights in bf16 (half the traffic, and what autocast would compute in) and
    reduces the gradients in fp32 (sums of many bf16 gradients lose precision), as torchtitan does. The
    sharded weights and the optimizer stay fp32."""
    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


class OnMeta:
    """`with OnMeta() as init: net = build()`: the net is built on the meta device (shapes, no memory) and
    `init.rng_state` is the random state a normal build would have drawn its weights from (see `materialize`)."""

    def __enter__(self) -> "OnMeta":
        self.rng_state = torch.random.get_rng_state()
        self._device = torch.device("meta")
        self._device.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._device.__exit__(*exc)


def is_on_meta(net: nn.Module) -> bool:
    return any(tensor.is_meta for tensor in [*net.parameters(), *net.buffers()])


INIT_MODES = ("full", "meta")


def check_init(mode: str) -> None:
    if mode not in INIT_MODES:
        raise ConfigError(f"strategy.init={mode} is unknown; valid: {', '.join(INIT_MODES)}")


@torch.no_grad()
def materialize(
    net: nn.Module, device: torch.device, rng_state: torch.Tensor, build: Callable[[], nn.Module] | None = None
) -> None:
    """Allocate this rank's shards of a net built on meta (and sharded), with the values a normal build draws.

    `build` given (strategy.init=full): the whole net is built once more on the CPU from `rng_state`, as
    strategy=single builds it, and each parameter and buffer keeps its slice of that build's, by name: any model,
    whatever its initialisation does, for the host memory of one whole model per process. Otherwise (init=meta)
    modules are initialised in registration order (their `reset_parameters()`) from `rng_state`, each on the
    CPU at full size one module at a time; only this rank's slice is kept. So the whole model never exists on
    a rank, and the weights equal strategy=single's (for models that register modules in the order they
    create them, as most do). Lightning's and torchtitan's meta init draw per shard instead, which differs.
    A no-op for a net that is not on meta.
    """
    if not is_on_meta(net):
        return
    uses: dict[torch.Tensor, list[tuple[nn.Module, str]]] = {}  # (module, name) of each parameter's uses
    for module in net.modules():
        for name, param in module._parameters.items():
            if param is not None:
                uses.setdefault(param, []).append((module, name))
    net.to_empty(device=device)
    for (owner, name), *others in (places for places in uses.values() if len(places) > 1):
        for module, other in others:  # to_empty gave each use a parameter of its own: tie them again
            module._parameters[other] = owner._parameters[name]
    if build is not None:
        _copy_from_full_build(net, build, rng_state)
        return
    filled: set[torch.Tensor] = set()  # a tied parameter keeps its first module's values, as in a normal build
    with torch.random.fork_rng(devices=[]):
        torch.random.set_rng_state(rng_state)
        for module in net.modules():
            own = {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False))}
            if not own:
                continue
            if not callable(getattr(module, "reset_parameters", None)):
                raise ConfigError(
                    f"strategy.init=meta draws each module's weights with its reset_parameters(), which "
                    f"{type(module).__name__} lacks: use strategy.init=full (the default: the whole model built once "
                    "on each process's CPU)"
                )
            for name, full in _initialised_full_size(module).items():  # drawn even if not kept: the same draws
                tensor = own[name]
                if tensor in filled:  # tied: e.g. a head sharing the embedding's weight, which the head's
                    continue  # own draw does not overwrite in a normal build either
                filled.add(tensor)
                if isinstance(tensor, DTensor):  # keep this rank's slice only
                    full = distribute_tensor(full, tensor.device_mesh, tensor.placements, src_data_rank=None)
                tensor.copy_(full)


def _copy_from_full_build(net: nn.Module, build: Callable[[], nn.Module], rng_state: torch.Tensor) -> None:
    """Fill `net`'s tensors (this rank's shards) from a whole build of it on the CPU from `rng_state`."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.random.set_rng_state(rng_state)
        full = build()
    values = {**dict(full.named_parameters(remove_duplicate=False)), **dict(full.named_buffers())}
    for name, tensor in [*net.named_parameters(remove_duplicate=False), *net.named_buffers()]:
        if name not in values or values[name].shape != tensor.shape:
            raise ConfigError(
                f"strategy.init=full: the model built again on the CPU has no {name} of shape {tuple(tensor.shape)} "
                "(does its build depend on more than its config and the seed?); try strategy.init=meta"
            )
        value = values[name].to(tensor.dtype)
        if isinstance(tensor, DTensor):  # keep this rank's slice only
            value = distribute_tensor(value, tensor.device_mesh, tensor.placements, src_data_rank=None)
        tensor.copy_(value)


def _initialised_full_size(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s own parameters and buffers at full (unsharded) size on the CPU, after its reset_parameters()."""
    # A shallow copy that shares everything but the tensors, which are fresh CPU ones (object.__new__: FSDP's
    # module classes construct themselves again in __new__).
    stand_in = object.__new__(type(module))
    stand_in.__dict__.update(vars(module))
    # None entries stay (a Linear without bias checks `self.bias is not None`).
    stand_in._parameters = {
        name: None if p is None else nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu"), p.requires_grad)
        for name, p in module._parameters.items()
    }
    stand_in._buffers = {
        name: torch.empty(b.shape, dtype=b.dtype, device="cpu") if b is not None else None
        for name, b in module._buffers.items()
    }
    stand_in.reset_parameters()
    return {name: t for name, t in {**stand_in._parameters, **stand_in._buffers}.items() if t is not None}


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for a model whose parameters are partly shards (DTensors, one group per
    device mesh) and partly plain tensors, which torch's refuses to mix: the norm is over the WHOLE gradient,
    every shard included, so the clipped update equals one device's. Returns that norm."""
    groups = _by_mesh(parameters)
    if not groups:
        return torch.tensor(0.0)
    norms = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([param.grad for param in params], norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # reduced over the shards
    total = torch.linalg.vector_norm(torch.stack([norm.to(norms[0].device) for norm in norms]), norm_type)
    for mesh, params in groups.items():
        norm = DTensor.from_local(total, mesh) if mesh is not None else total  # replicated on that mesh
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return total


@torch.no_grad()
def clip_grad_value_(parameters: Iterable[torch.Tensor], clip_value: float) -> None:
    """torch.nn.utils.clip_grad_value_ for shards next to plain tensors (torch's refuses the mix): every gradient
    element is clamped to [-clip_value, clip_value] where it lives, as on one device."""
    for params in _by_mesh(parameters).values():
        torch.nn.utils.clip_grad_value_(params, clip_value)


def _by_mesh(parameters: Iterable[torch.Tensor]) -> dict[object, list[torch.Tensor]]:
    """The parameters that have a gradient, by the device mesh of their shards (None: plain tensors)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for param in parameters:
        if param.grad is not None:
            key = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
            groups.setdefault(key, []).append(param)
    return groups


def default_layer_devices() -> list[str]:
    """Every visible GPU, or two CPU "devices" for trying layer splitting out."""
    count = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(count)] if count > 1 else ["cpu", "cpu"]


def check_layer_split(model: nn.Module, devices: Sequence[torch.device | str]) -> None:
    devices = [torch.device(device) for device in devices]
    gpus = torch.cuda.device_count()  # (asks NVML where CUDA is not initialised yet)
    missing = [str(device) for device in devices if device.type == "cuda" and (device.index or 0) >= gpus]
    if missing:
        raise ConfigError(
            f"strategy.devices={[str(d) for d in devices]}: this machine has no {', '.join(missing)} (torch sees "
            f"{gpus} GPUs); name devices it has, or strategy.devices=[cpu,cpu] to try layer splitting on the CPU"
        )
    try:
        groups = layer_groups(model, len(devices))
    except ConfigError:  # no split: already one line naming what to implement
        raise
    except ValueError as err:
        raise ConfigError(f"strategy.devices={[str(d) for d in devices]}: {err}") from err
    # A parameter used by two layer groups (tied weights) lives on one device: both groups must be on it.
    net, _ = find_split(model, "model_parallel")
    names = {param: name for name, param in net.named_parameters()}
    device_of: dict[torch.Tensor, torch.device] = {}
    for group, device in zip(groups, devices, strict=True):
        for param in (param for module in group for param in module.parameters()):
            if device_of.setdefault(param, device) != device:
                raise ConfigError(
                    f"strategy.mode=layers would use {names[param]} (tied weights) on {device_of[param]} and on "
                    f"{device}; untie them (model=gpt: model.net.tie_weights=false) or use strategy=pipeline"
                )


class _Devices(TorchFunctionMode):
    """Follows the device each tensor of a forward would be on under place_layer_groups (its layer group's, as a
    number: a run on [cpu,cpu] shows nothing) and keeps the first operation that takes tensors of two: written by
    hand, torch has no way to try a placement over GPUs on a machine without them."""

    def __init__(self) -> None:
        super().__init__()
        self.group: dict[int, int] = {}  # id(tensor) -> its layer group; a tensor created from none: anywhere
        self.kept: list[torch.Tensor] = []  # (alive while traced: no id is reused)
        self.running: list[str] = []  # the names of the layer-group modules whose forward is running
        self.mixed = ""  # the first operation that takes tensors of two groups

    def place(self, tensor: torch.Tensor, group: int) -> None:
        self.group[id(tensor)] = group
        self.kept.append(tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and id(t) in self.group]
        groups = sorted({self.group[id(t)] for t in inputs})
        if len(groups) > 1 and not self.mixed:
            where = f"in {self.running[-1]}" if self.running else "in the net's own forward (between its parts)"
            name = getattr(func, "__name__", func)
            self.mixed = f"`{name}` {where} takes tensors of layer groups {groups[0]} and {groups[-1]}"
        # Moved by the forward itself (x.to(h.device)): anywhere. A new tensor: on the CPU, .to returns its input.
        if getattr(func, "__name__", "") in MOVES and isinstance(out, torch.Tensor):
            return out.view_as(out)
        for tensor in (t for t in tree_leaves(out) if isinstance(t, torch.Tensor)) if groups else ():
            self.place(tensor, groups[-1])
        return out


MOVES = ("to", "cuda", "cpu", "type_as")


def check_layer_devices(model: nn.Module, example: Any, groups: int) -> None:
    """Refuse, before training, a net whose forward would mix devices once its layer groups sit on `groups` devices
    (a skip connection from one group into another: on GPUs a RuntimeError at the first step, on [cpu,cpu] nothing).
    Runs the net's forward on `example` (a batch of one, as the loader gives it: a tensor, or a dict or tuple of them;
    data.checks.first_input) in eval mode without gradients, its tensors followed by _Devices. A net on the meta
    device, or no example, is not checked."""
    net, _ = find_split(model, "model_parallel")
    if groups < 2 or example is None or any(param.is_meta for param in net.parameters()):
        return
    parts = layer_groups(model, groups)
    names = {module: name for name, module in net.named_modules()}
    devices = _Devices()
    held: dict[int, set[int]] = {}  # id(parameter or buffer) -> the groups that hold it
    for index, group in enumerate(parts):
        for tensor in (t for module in group for t in (*module.parameters(), *module.buffers())):
            held.setdefault(id(tensor), set()).add(index)
            devices.place(tensor, index)
    for shared in (key for key, owners in held.items() if len(owners) > 1):  # tied weights: check_layer_split's
        del devices.group[shared]
    for tensor in (*net.parameters(), *net.buffers()):  # outside the parts: on the first device, with the input
        if id(tensor) not in held:
            devices.place(tensor, 0)
    for tensor in tree_leaves(example):
        if isinstance(tensor, torch.Tensor):
            devices.place(tensor, 0)

    def moved_to(index: int, module: nn.Module):
        def hook(_: nn.Module, args: tuple) -> tuple:  # place_layer_groups's .to(device): a new tensor there
            devices.running.append(names[module])
            moved = tree_map_only(torch.Tensor, lambda arg: arg.view_as(arg), args)
            for arg in tree_leaves(moved):
                if isinstance(arg, torch.Tensor):
                    devices.place(arg, index)
            return moved

        return hook

    handles = [m.register_forward_pre_hook(moved_to(i, m)) for i, group in enumerate(parts) for m in group]

    def left(*_: object) -> None:
        devices.running.pop()

    handles += [m.register_forward_hook(left) for group in parts for m in group]
    training = net.training
    net.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), devices:  # (the net is on the CPU here)
            net(example)
    finally:
        for handle in handles:
            handle.remove()
        net.train(training)
    if devices.mixed:
        raise ConfigError(
            f"strategy.mode=layers puts {type(net).__name__}'s {groups} layer groups on devices one after another, but "
            f"{devices.mixed}, which would be on two devices (a skip connection across groups, say: a RuntimeError on "
            "GPUs, though [cpu,cpu] runs it). Keep it inside one group (fewer devices), make the forward a chain of "
            "its Split, or train it with strategy=ddp or fsdp"
        )


def place_layer_groups(model: nn.Module, devices: Sequence[torch.device]) -> list[RemovableHandle]:
    """Put layer group i on devices[i]; inputs follow the layers, the output comes back to devices[0]
    (where the labels and the loss are). Returns the hooks, to remove before placing again."""
    hooks = []
    net, _ = find_split(model, "model_parallel")
    for group, device in zip(layer_groups(net, len(devices)), devices, strict=True):
        for module in group:
            module.to(device)
            hooks.append(module.register_forward_pre_hook(_move_inputs_to(device)))
    hooks.append(net.register_forward_hook(lambda module, args, output: output.to(devices[0])))
    return hooks


def _move_inputs_to(device: torch.device):
    def hook(module: nn.Module, args: tuple) -> tuple:  # (tensors inside a dict or tuple argument too)
        return tree_map_only(torch.Tensor, lambda arg: arg.to(device), args)

    return hook
