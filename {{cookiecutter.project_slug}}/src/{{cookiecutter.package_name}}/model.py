"""The network: a plain nn.Module made of repeated residual blocks.

Being a stack of identical blocks is what lets the parallel presets split it: tensor
parallelism shards the two linear layers inside each block, layer and pipeline
parallelism cut the stack between blocks. To bring your own model, keep forward()
and implement the same split hooks (see README, "Bring your own model").
"""

import torch
from torch import nn


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
