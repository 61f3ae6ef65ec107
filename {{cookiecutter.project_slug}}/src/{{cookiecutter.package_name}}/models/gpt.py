"""model=gpt: a small decoder-only transformer language model, and how the parallel presets split it.

tokens (B, T) -> embed (token + learned position) -> depth x Block -> norm -> head -> next-token logits (B, T, V).
Each Block is pre-norm: x + attn(norm(x)), then x + mlp(norm(x)); attention is causal (token t sees 0..t).

Its `Split` (registered below the classes): tensor parallelism shards the attention heads and the MLP,
pipeline stages and layer groups are cut between blocks (the embedding goes with the first, norm and head with
the last), FSDP2 shards one block at a time. With `tie_weights` the head reuses the token embedding's matrix
(fewer parameters; the usual choice for language models). Every preset keeps the pair one parameter: FSDP2 shards
it once, in the root unit (split.fsdp_units); the meta-device build keeps it tied (sharding.materialize);
pipeline stages add up the gradients of their copies (split.tied_across_stages, pipelining.Pipeline).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from ..errors import ConfigError
from ..parallel.split import Split, register_split

NORMS = {"rms": nn.RMSNorm, "layer": nn.LayerNorm}


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q, k, v and output projections, so that tensor
    parallelism can shard q, k, v by heads (colwise) and the output by its input (rowwise)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads  # sharding.check_tensor_parallel reads it: heads must divide over the ranks
        self.head_dim = dim // num_heads
        # No biases, as in most current LMs: k's would get no gradient at all (softmax ignores a shift shared by all
        # keys), so Adam would move it by rounding noise alone.
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        # -1 heads, not num_heads: a tensor-parallel rank's q, k and v hold only its share of the heads.
        q, k, v = (proj(x).view(batch, time, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, head_dim)
        return self.out(attended.transpose(1, 2).reshape(batch, time, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, expansion: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(dim, dim * expansion)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(dim * expansion, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, expansion: int, norm: str) -> None:
        super().__init__()
        self.norm1, self.attn = NORMS[norm](dim), CausalSelfAttention(dim, num_heads)
        self.norm2, self.mlp = NORMS[norm](dim), MLP(dim, expansion)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ScaledEmbedding(nn.Embedding):
    """nn.Embedding initialised N(0, 1/dim) instead of N(0, 1): a tied head then starts with logits of about unit
    scale (N(0, 1) would make them ~sqrt(dim)). Its own reset_parameters, so a build on the meta device
    (model_parallel) draws the same values."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.embedding_dim**-0.5)


class Embeddings(nn.Module):
    """Token plus learned position embedding: one module, so that it is one step of a pipeline's first stage."""

    def __init__(self, vocab_size: int, max_seq_len: int, dim: int) -> None:
        super().__init__()
        self.tokens = ScaledEmbedding(vocab_size, dim)
        self.positions = ScaledEmbedding(max_seq_len, dim)

    def check_input(self, tokens: torch.Tensor) -> None:
        """Refuse data this model cannot read, in one line (data.check_input calls it before training)."""
        if tokens.is_floating_point():  # e.g. model=gpt data=synthetic: a one-line error, not an embedding's traceback
            raise ConfigError(
                f"model=gpt reads token ids (integers), but the data gives {str(tokens.dtype).removeprefix('torch.')} "
                "samples: use data=tokens, or data=files whose x and y hold token ids (a data.collate_fn of yours: "
                "return them as integers)"
            )
        length, max_seq_len = tokens.shape[1], self.positions.num_embeddings
        if length > max_seq_len:
            raise ConfigError(
                f"sequences of {length} tokens are longer than the model's max_seq_len={max_seq_len}: raise "
                "model.net.max_seq_len, or cut the sequences"
            )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.check_input(tokens)
        return self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))


class GPT(nn.Module):
    """Decoder-only transformer LM. Input: token ids (B, T); output: logits of the next token (B, T, vocab_size).

    norm: "rms" (RMSNorm) or "layer" (LayerNorm). tie_weights: the head's weight is the token embedding's."""

    def __init__(
        self,
        vocab_size: int,
        max_seq_len: int,
        dim: int = 64,
        depth: int = 4,
        num_heads: int = 4,
        expansion: int = 4,
        norm: str = "rms",
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r} is unknown; valid: {', '.join(NORMS)}")
        self.embed = Embeddings(vocab_size, max_seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, num_heads, expansion, norm) for _ in range(depth))
        self.norm = NORMS[norm](dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.embed.tokens.weight  # one Parameter, used twice: its gradient is the sum

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# Megatron's transformer split: q, k, v colwise (each rank computes its own heads' attention, no communication),
# the output projection rowwise (partial sums all-reduced); the MLP alike (fc_in colwise, fc_out rowwise). Two
# all-reduces per block.
# The embedding and the head stay whole on every tensor-parallel rank (small here; a large vocabulary would
# shard them too), so a tied pair stays one plain parameter.
register_split(
    GPT,
    Split(
        first=["embed"],
        blocks=["blocks.*"],
        last=["norm", "head"],
        tensor_parallel={
            "blocks.*.attn.q": ColwiseParallel(),
            "blocks.*.attn.k": ColwiseParallel(),
            "blocks.*.attn.v": ColwiseParallel(),
            "blocks.*.attn.out": RowwiseParallel(),
            "blocks.*.mlp.fc_in": ColwiseParallel(),
            "blocks.*.mlp.fc_out": RowwiseParallel(),
        },
    ),
)
