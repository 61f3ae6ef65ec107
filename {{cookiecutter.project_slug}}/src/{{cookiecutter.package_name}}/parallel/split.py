"""How a model is split over devices: all that strategy=model_parallel and strategy=pipeline need to know.

A model describes its split once, outside its class, next to it: `register_split(MyNet, Split(...))` (as
torchtitan keeps `parallelize_<model>()` beside each model). The data-parallel presets never need it; the
presets that split the model refuse, before training, a model that has none. From one `Split` come:

- the tensor-parallel plan (sharding.parallelize, checked against the model by sharding.check_tensor_parallel);
- the FSDP2 units: `first`, every block and `last`, one unit each;
- the layer groups (model_parallel mode=layers) and pipeline stages: consecutive runs of layers, cut between blocks.
"""

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from ..errors import ConfigError


@dataclass(frozen=True)
class Split:
    """How to cut a net. Names are the net's submodule names; `*` matches any one part ("blocks.*").

    The net's forward must equal running `first`, `blocks` and `last` one after another, each on the previous
    one's output: that is what a pipeline stage or a layer group runs.
    """

    blocks: Sequence[str]  # the layers pipeline stages and layer groups are cut between, in forward order
    first: Sequence[str] = ()  # run before the blocks, on the first stage (e.g. the embedding)
    last: Sequence[str] = ()  # run after them, on the last stage (e.g. the final norm and the head)
    tensor_parallel: Mapping[str, ParallelStyle] = field(default_factory=dict)  # name pattern -> how to shard it


class RefusedStyle(ParallelStyle):
    """A tensor_parallel entry that tensor parallelism refuses, with the reason (e.g. a model library's style the
    template does not map to torch's): sharding.check_tensor_parallel raises it when the plan would be applied, so
    the presets that do not apply the plan (pipeline, layer groups, FSDP2 alone) still train the model."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def _apply(self, module: nn.Module, device_mesh: object) -> nn.Module:
        raise ConfigError(self.reason)


_SPLITS: dict[type, Split | Callable[[nn.Module], Split]] = {}


def register_split(model_class: type[nn.Module], split: Split | Callable[[nn.Module], Split]) -> None:
    """Say how `model_class` (and its subclasses) is split. Call it in the module that defines the class. A function
    of the net instead of a Split: for a class whose layer names depend on how it was built (models/causal_lm.py)."""
    _SPLITS[model_class] = split


def find_split(model: nn.Module, preset: str) -> tuple[nn.Module, Split]:
    """(the net, its Split): the first submodule of `model` (a LightningModule, or the net itself) whose class
    has a registered split. Raises ConfigError naming what to implement when there is none."""
    if (module := split_net(model)) is not None:
        split = next(_SPLITS[cls] for cls in type(module).__mro__ if cls in _SPLITS)
        return module, split if isinstance(split, Split) else split(module)
    net = type(getattr(model, "net", model)).__name__
    raise ConfigError(
        f"strategy={preset} needs to know how to split {net}: add register_split({net}, Split(first=..., blocks=..., "
        "last=..., tensor_parallel=...)) next to the class (see docs/your-model.md, 'Bring your own model')"
    )


def split_net(model: nn.Module) -> nn.Module | None:
    """The first submodule of `model` (a LightningModule, or the net itself) whose class has a registered split."""
    return next((module for module in model.modules() if has_split(module)), None)


def has_split(net: nn.Module) -> bool:
    return any(cls in _SPLITS for cls in type(net).__mro__)


def require_split(net: nn.Module, setting: str, does: str) -> None:
    """Refuse a `setting` that works on the blocks of the model's Split (`does`: what it does with them) for a net
    that has none, naming what to add."""
    if not has_split(net):
        name = type(net).__name__
        raise ConfigError(
            f"{setting} {does} the model's Split, and {name} has none: add register_split({name}, Split(blocks=...)) "
            "next to the class (docs/your-model.md)"
        )


def matches(name: str, pattern: str) -> bool:
    parts, wanted = name.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(w == "*" or w == p for p, w in zip(parts, wanted, strict=True))


def expand(net: nn.Module, patterns: Iterable[str]) -> list[str]:
    """The submodule names the patterns match, pattern by pattern, each in the net's order."""
    names = [name for name, _ in net.named_modules()]
    found = []
    for pattern in patterns:
        matched = [name for name in names if matches(name, pattern)]
        if not matched:
            raise ConfigError(f"the Split of {type(net).__name__} names {pattern!r}, which matches no submodule")
        found += matched
    if repeated := next((name for name in found if found.count(name) > 1), None):
        raise ConfigError(
            f"the Split of {type(net).__name__} lists {repeated} twice: list each module once (a module the forward "
            "runs twice cannot be two parts of a chain: strategy=pipeline and model_parallel's mode=layers cannot "
            "split that model; fsdp and tensor parallelism take it listed once)"
        )
    return found


def tensor_parallel_plan(net: nn.Module, preset: str) -> dict[str, Any]:
    """The Split's tensor-parallel plan of `net` for torch's parallelize_module, each pattern replaced by the names it
    matches here (check_tensor_parallel refuses one that matches none): torch matches `*.up` against every part and
    warned once for each part without an `up`."""
    plan = find_split(net, preset)[1].tensor_parallel
    names = [name for name, _ in net.named_modules()]
    return {name: style for pattern, style in plan.items() for name in names if matches(name, pattern)}


def layers(model: nn.Module, preset: str) -> tuple[nn.Module, list[str], list[str], list[str]]:
    """(the net inside `model`, its first, blocks and last as submodule names of the net)."""
    net, split = find_split(model, preset)
    return net, expand(net, split.first), expand(net, split.blocks), expand(net, split.last)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one (only one is gathered at a time): every layer of the split, except
    layers that share a parameter with another layer (tied weights, e.g. a head reusing the embedding's matrix).
    FSDP2 must shard a parameter once, in a unit that is gathered for all its uses: those layers stay in the
    root unit (`fully_shard(net)`), whose parameters are gathered for the whole forward and backward."""
    net, first, blocks, last = layers(model, "model_parallel")
    units = [net.get_submodule(name) for name in (*first, *blocks, *last)]
    uses = Counter(param for unit in units for param in unit.parameters())
    return [unit for unit in units if all(uses[param] == 1 for param in unit.parameters())]


def tied_across_stages(
    net: nn.Module, num_stages: int, split_points: Sequence[int] | None = None
) -> list[tuple[list[int], dict[int, str]]]:
    """Parameters that several pipeline stages hold (tied weights: the first stage's embedding is the last stage's
    head): for each, (the stages holding it, each stage's name for it). Every stage keeps a copy, so the stages
    must add up the copies' gradients before each step (pipelining.Pipeline does), as one device's autograd
    adds up the uses of one parameter."""
    holders: dict[nn.Parameter, dict[int, str]] = {}
    for stage in range(num_stages):
        for name, param in pipeline_stage(net, stage, num_stages, split_points).named_parameters():
            holders.setdefault(param, {})[stage] = name
    return [(sorted(names), names) for names in holders.values() if len(names) > 1]


def layer_groups(model: nn.Module, n: int) -> list[list[nn.Module]]:
    """The net cut into n consecutive groups of modules, one per device (model_parallel mode=layers)."""
    net, first, blocks, last = layers(model, "model_parallel")
    if not blocks:  # ("valid: 1 to 0")
        raise ValueError(
            f"the Split of {type(net).__name__} names no blocks, which model_parallel's strategy.mode=layers spreads "
            "over the devices: name its repeated blocks in the Split (docs/your-model.md)"
        )
    if not 1 <= n <= len(blocks):
        raise ValueError(f"cannot split {len(blocks)} blocks over {n} devices; valid: 1 to {len(blocks)}")
    groups = [[blocks[i] for i in part] for part in split_blocks(len(blocks), n)]
    groups[0][:0] = first
    groups[-1] += last
    return [[net.get_submodule(name) for name in group] for group in groups]


def pipeline_stage(model: nn.Module, stage: int, num_stages: int, split_points: Sequence[int] | None = None) -> "Chain":
    """The part of the net that pipeline stage `stage` of `num_stages` runs. split_points[i] is the first block
    of stage i + 1 (default: blocks spread evenly); the first stage also runs `first`, the last one `last`."""
    net, first, blocks, last = layers(model, "pipeline")
    part = split_blocks(len(blocks), num_stages, split_points)[stage]
    names = [blocks[i] for i in part]
    if stage == 0:
        names[:0] = first
    if stage == num_stages - 1:
        names += last
    return Chain(net, names)


class Chain(nn.Module):
    """Submodules of a net run one after another, registered under the names they have in the net
    (blocks.2.fc_in.weight), so that the state dicts of a net's parts merge into the net's."""

    def __init__(self, net: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.names = list(names)
        for name in self.names:
            parent, (*path, leaf) = self, name.split(".")
            for part in path:
                if part not in parent._modules:
                    parent.add_module(part, nn.Module())  # an empty container, for the name only
                parent = parent._modules[part]
            parent.add_module(leaf, net.get_submodule(name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            x = self.get_submodule(name)(x)
        return x


def check_chain(model: nn.Module, example: Any, preset: str = "pipeline") -> None:
    """Refuse, before training, a Split whose chain of parts is not the net's forward: what a pipeline runs would be
    another model, trained without a word (a forward that adds a position embedding between the embedding and the
    first block, say). Runs the net's forward and the chain on `example` (a sample or two), in eval mode, without
    gradients, and names the first part whose input differs. A net on the meta device is not checked."""
    net, first, blocks, last = layers(model, preset)
    if example is not None and not isinstance(example, torch.Tensor):  # (the stages' send and receive)
        raise ConfigError(
            f"strategy={preset} passes one tensor from stage to stage, the data's x to the first, but x is a "
            f"{type(example).__name__}: give {type(net).__name__} one tensor (e.g. the inputs concatenated), or train "
            "it with strategy=fsdp or model_parallel, which take any input"
        )
    names, seen = [*first, *blocks, *last], {}
    if example is None or any(param.is_meta for param in net.parameters()):
        check_all_in_parts(net, names, preset)
        return

    def recorder(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            seen.setdefault(name, args[0] if len(args) == 1 else args)

        return hook

    handles = [net.get_submodule(name).register_forward_pre_hook(recorder(name)) for name in names]
    training = net.training
    net.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng():
            expected = net(example)
            for handle in handles:
                handle.remove()
            x, previous = example, "the net's input"
            for name in names:
                if name not in seen or not _same(seen[name], x):
                    how = "never calls it" if name not in seen else f"gives it something else than {previous}"
                    fix = "fold a position embedding into the first part's module"
                    if isinstance(seen.get(name), tuple):  # (x, mask): a stage passes one tensor to the next
                        how, fix = f"gives it {len(seen[name])} inputs", "carry a mask inside the one tensor"
                    raise ConfigError(
                        f"strategy={preset} runs {type(net).__name__}'s Split as a chain (first, blocks, last, each on "
                        f"the one before's output), but its forward {how} for {name}: it would train another model. "
                        f"Make the forward that chain (e.g. {fix}), or use a preset that runs the model's own forward "
                        "(ddp, model_parallel)"
                    )
                x, previous = net.get_submodule(name)(x), f"{name}'s output"
            if not _same(expected, x):
                raise ConfigError(
                    f"strategy={preset}: {type(net).__name__}'s forward returns something else than its Split's last "
                    f"part ({names[-1]}): it would train another model. Make the forward end with that part"
                )
    finally:
        for handle in handles:
            handle.remove()
        net.train(training)
    check_all_in_parts(net, names, preset)


def check_all_in_parts(net: nn.Module, names: list[str], preset: str) -> None:
    """Refuse a net with weights or buffers outside its Split's parts: the stages hold the parts only, so these would
    be neither trained nor saved (a checkpoint that then fails to load under any other preset)."""
    inside = tuple(f"{name}." for name in names)
    outside = [key for key in net.state_dict(keep_vars=True) if not key.startswith(inside)]
    if outside:
        raise ConfigError(
            f"strategy={preset} keeps only the parts of {type(net).__name__}'s Split (first, blocks, last) in its "
            f"stages, but {', '.join(outside[:3])}{' ...' if len(outside) > 3 else ''} lie outside them: no stage "
            "would train or save them. Move them into a part, or use a preset that keeps the whole net (ddp, fsdp)"
        )


def _same(a: object, b: object) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5))
    )


def split_blocks(num_blocks: int, num_stages: int, split_points: Sequence[int] | None = None) -> list[range]:
    """The blocks each pipeline stage runs. Raises ValueError for a split that leaves a stage without blocks."""
    if num_stages > num_blocks:
        raise ValueError(f"{num_stages} pipeline stages need at least {num_stages} blocks; the model has {num_blocks}")
    if split_points is None:  # balanced: the first num_blocks % num_stages stages get one block more
        size, extra = divmod(num_blocks, num_stages)
        split_points = [(stage + 1) * size + min(stage + 1, extra) for stage in range(num_stages - 1)]
    bounds = [0, *split_points, num_blocks]
    if len(split_points) != num_stages - 1 or any(a >= b for a, b in pairwise(bounds)):
        raise ValueError(
            f"split_points={list(split_points)} must be {num_stages - 1} increasing block indices between 1 and "
            f"{num_blocks - 1} (the first block of each stage after the first)"
        )
    return [range(a, b) for a, b in pairwise(bounds)]
