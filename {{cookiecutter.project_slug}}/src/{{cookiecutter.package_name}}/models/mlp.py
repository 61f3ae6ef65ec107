"""The network: a plain nn.Module made of repeated residual blocks, and how the parallel presets split it.

Any nn.Module trains under the data-parallel presets. model_parallel and pipeline also need its `Split`
(registered below, outside the class): tensor parallelism shards the two linear layers inside each block,
layer and pipeline parallelism cut the stack between blocks (see parallel/split.py and docs/your-model.md,
"Bring your own model").
"""

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.nn.parameter import is_lazy

from ..errors import ConfigError
from ..parallel.split import Split, register_split

NORMS = {"layer": nn.LayerNorm, "batch": nn.BatchNorm1d, "none": lambda features: nn.Identity()}


def make_norm(norm: str, features: int) -> nn.Module:
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r} is unknown; valid: {', '.join(NORMS)}")
    return NORMS[norm](features)


class Block(nn.Module):
    """Pre-norm residual MLP block: x + dropout(fc_out(gelu(fc_in(norm(x)))))."""

    def __init__(self, hidden: int, expansion: int, norm: str = "layer", dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = make_norm(norm, hidden)
        self.fc_in = nn.Linear(hidden, hidden * expansion)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(hidden * expansion, hidden)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()  # none: draws no random numbers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.fc_out(self.act(self.fc_in(self.norm(x)))))


class ResidualMLP(nn.Module):
    """embed -> depth x Block -> norm -> head. Outputs class logits.

    norm: "layer" (LayerNorm), "batch" (BatchNorm1d: under ddp its batch statistics are synchronised over the
    processes, see batchnorm.py) or "none". dropout: the probability of zeroing each of a block's outputs in
    training (0: off). Its random masks depend on how the batch is split over processes, so with dropout the
    presets no longer compute exactly what one device computes."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        hidden: int = 128,
        depth: int = 4,
        expansion: int = 4,
        norm: str = "layer",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in (("hidden", hidden), ("depth", depth), ("expansion", expansion)):
            if not (type(value) is int and value >= 1):  # 0 trained a model of no blocks or no width, without a word
                raise ConfigError(f"model.net.{name}={value} must be a whole number >= 1")
        for name, value in (("in_features", in_features), ("num_classes", num_classes)):  # (torch's traceback)
            if not (type(value) is int and value >= 1):
                raise ConfigError(
                    f"model.net.{name}={value} (data.{name.replace('in_', 'num_')}) must be a whole number >= 1"
                )
        self.embed = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(Block(hidden, expansion, norm, dropout) for _ in range(depth))
        self.norm = make_norm(norm, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def check_input(self, x: torch.Tensor) -> None:
        """Refuse samples of another size than the model's, in one line (data.check_input calls it before training
        with a batch of one): a wrong data.num_features would fail in the first step, in a matrix product."""
        if x.dim() != 2:
            raise ConfigError(
                f"the classifier's MLP takes each sample as a vector, the data's are of shape {tuple(x.shape[1:])}: "
                "flatten them (data=files: data.flatten=true), or use a model of yours that takes that shape"
            )
        if x.shape[1] != self.embed.in_features and not is_lazy(self.embed.weight):  # (a LazyLinear sizes itself)
            raise ConfigError(
                f"the data's samples have {x.shape[1]} values, the model takes {self.embed.in_features} "
                f"(model.net.in_features, which reads data.num_features): set data.num_features={x.shape[1]}"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# The Megatron MLP split: fc_in is sharded by output features (colwise), so each tensor-parallel rank computes a
# slice of the hidden activations (LayerNorm runs before it on the full input, GELU is elementwise); fc_out by
# input features (rowwise), its partial results summed across ranks: one all-reduce per block.
register_split(
    ResidualMLP,
    Split(
        first=["embed"],
        blocks=["blocks.*"],
        last=["norm", "head"],
        tensor_parallel={"blocks.*.fc_in": ColwiseParallel(), "blocks.*.fc_out": RowwiseParallel()},
    ),
)
