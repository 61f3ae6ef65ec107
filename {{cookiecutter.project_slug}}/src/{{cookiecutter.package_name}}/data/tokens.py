"""data=tokens: token sequences for the language model (model=gpt), generated in-process from the seed.

The text is a walk on a fixed random sparse Markov chain: each token can be followed by at most `branching` of the
`vocab_size` tokens, with random probabilities. A model that has learned the chain predicts the next token with
a loss near the chain's entropy (at most log(branching)), far below the log(vocab_size) of guessing, so a
falling val/loss shows learning. Each sample is one sequence: x = tokens 0..T-1, y = tokens 1..T (next tokens).
"""

import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigError


class TokenData(TensorDataset):
    def __init__(
        self,
        split: str,
        vocab_size: int = 64,
        seq_len: int = 32,
        branching: int = 4,
        train_size: int = 2048,
        val_size: int = 256,
        test_size: int = 256,
        seed: int = 0,
    ) -> None:
        sizes = {"train": train_size, "val": val_size, "test": test_size}
        if split not in sizes:
            raise ValueError(f"split={split!r}; valid: {', '.join(sizes)}")
        if vocab_size < 1 or seq_len < 1:  # (seq_len=0: the run started, then a reshape's traceback at the first step)
            raise ConfigError(f"data.vocab_size={vocab_size} and data.seq_len={seq_len} must be 1 or more")
        if not 1 <= branching <= vocab_size:
            raise ConfigError(
                f"data.dataset.branching={branching} must be between 1 and data.vocab_size={vocab_size}: give "
                f"data.dataset.branching={max(1, min(branching, vocab_size))} or a larger vocabulary"
            )
        # One generator for the chain and all splits in order: each split is the same whichever is asked for.
        generator = torch.Generator().manual_seed(seed)
        # Drawn per token (repeats allowed), not by sorting a vocab_size x vocab_size table: that took minutes and
        # 12 GB at a vocabulary of 32768.
        successors = torch.randint(vocab_size, (vocab_size, branching), generator=generator)
        weights = torch.rand(vocab_size, branching, generator=generator) + 0.1  # every successor is possible
        for name, size in sizes.items():
            tokens = torch.empty(size, seq_len + 1, dtype=torch.long)
            tokens[:, 0] = torch.randint(vocab_size, (size,), generator=generator)
            for t in range(seq_len):  # all sequences advance together, one token at a time
                choice = torch.multinomial(weights[tokens[:, t]], 1, generator=generator).squeeze(1)
                tokens[:, t + 1] = successors[tokens[:, t], choice]
            if name == split:
                super().__init__(tokens[:, :-1], tokens[:, 1:])
                return
