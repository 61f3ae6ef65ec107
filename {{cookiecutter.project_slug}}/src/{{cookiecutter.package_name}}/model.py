"""The network: a plain nn.Module made of repeated residual blocks.

Being a stack of identical blocks is what lets the parallel presets split it: tensor
parallelism shards the two linear layers inside each block, layer and pipeline
parallelism cut the stack between blocks. To bring your own model, keep forward()
and implement the same split hooks (see README, "Bring your own model").
"""

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

NORMS = {"layer": nn.LayerNorm, "batch": nn.BatchNorm1d, "none": lambda features: nn.Identity()}


def make_norm(norm: str, features: int) -> nn.Module:
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r} is unknown; valid: {', '.join(NORMS)}")
    return NORMS[norm](features)


class Block(nn.Module):
    """Pre-norm residual MLP block: x + fc_out(gelu(fc_in(norm(x))))."""

    def __init__(self, hidden: int, expansion: int, norm: str = "layer") -> None:
        super().__init__()
        self.norm = make_norm(norm, hidden)
        self.fc_in = nn.Linear(hidden, hidden * expansion)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(hidden * expansion, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc_out(self.act(self.fc_in(self.norm(x))))


class ResidualMLP(nn.Module):
    """embed -> depth x Block -> norm -> head. Outputs class logits.

    norm: "layer" (LayerNorm), "batch" (BatchNorm1d: under ddp its batch statistics are synchronised over the
    processes, see batchnorm.py) or "none"."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        hidden: int = 128,
        depth: int = 4,
        expansion: int = 4,
        norm: str = "layer",
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(Block(hidden, expansion, norm) for _ in range(depth))
        self.norm = make_norm(norm, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    # The split hooks: the only model-specific code the model_parallel preset needs.

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        """How to shard each block over the tensor-parallel ranks (the Megatron MLP split).

        fc_in is split by output features (colwise), so each rank computes a slice of the hidden
        activations; LayerNorm runs before it on the full input and GELU is elementwise, so both
        work on that slice unchanged. fc_out is split by input features (rowwise) and its partial
        results are summed across ranks: one all-reduce per block, and every rank gets the full output.
        """
        return {"blocks.*.fc_in": ColwiseParallel(), "blocks.*.fc_out": RowwiseParallel()}

    def layer_groups(self, n: int) -> list[list[nn.Module]]:
        """The model cut into n consecutive groups of modules, one per device, for layer parallelism."""
        if not 1 <= n <= len(self.blocks):
            raise ValueError(f"cannot split {len(self.blocks)} blocks over {n} devices; valid: 1 to {len(self.blocks)}")
        groups: list[list[nn.Module]] = [
            [self.blocks[i] for i in blocks] for blocks in split_blocks(len(self.blocks), n)
        ]
        groups[0].insert(0, self.embed)
        groups[-1] += [self.norm, self.head]
        return groups

    def pipeline_stage(self, stage: int, num_stages: int, split_points: Sequence[int] | None = None) -> nn.Module:
        """Pipeline-parallel hook: the part of this net that pipeline stage `stage` of `num_stages` runs.

        The stack is cut between blocks: split_points[i] is the first block of stage i + 1 (default:
        blocks spread evenly). Stage 0 also runs embed, the last stage norm and head.
        """
        blocks = split_blocks(len(self.blocks), num_stages, split_points)[stage]
        return StageNet(self, blocks, first=stage == 0, last=stage == num_stages - 1)


class StageNet(nn.Module):
    """The slice of a ResidualMLP that one pipeline stage runs.

    Parameter names match ResidualMLP's (blocks keep their index: blocks.2.fc_in.weight), so the
    stages' state dicts merge into a single-device one.
    """

    def __init__(self, net: ResidualMLP, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.embed = net.embed if first else None
        self.blocks = nn.ModuleDict({str(i): net.blocks[i] for i in blocks})
        self.norm = net.norm if last else None
        self.head = net.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


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
