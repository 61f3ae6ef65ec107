"""The network: a plain nn.Module made of repeated residual blocks.

Being a stack of identical blocks is what lets the parallel presets split it: tensor
parallelism shards the two linear layers inside each block, layer and pipeline
parallelism cut the stack between blocks. To bring your own model, keep forward()
and implement the same split hooks (see README, "Bring your own model").
"""

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel


class Block(nn.Module):
    """Pre-norm residual MLP block: x + fc_out(gelu(fc_in(norm(x))))."""

    def __init__(self, hidden: int, expansion: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc_in = nn.Linear(hidden, hidden * expansion)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(hidden * expansion, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc_out(self.act(self.fc_in(self.norm(x))))


class ResidualMLP(nn.Module):
    """embed -> depth x Block -> norm -> head. Outputs class logits."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 128, depth: int = 4, expansion: int = 4):
        super().__init__()
        self.embed = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(Block(hidden, expansion) for _ in range(depth))
        self.norm = nn.LayerNorm(hidden)
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
        chunks = torch.arange(len(self.blocks)).tensor_split(n)
        groups: list[list[nn.Module]] = [[self.blocks[i] for i in chunk.tolist()] for chunk in chunks]
        groups[0].insert(0, self.embed)
        groups[-1] += [self.norm, self.head]
        return groups
