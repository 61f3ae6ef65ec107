"""Where samples come from: loading (the batch arithmetic), generated data, token data, files, streaming."""

# A class target no loss or metric counts (F.cross_entropy's ignore_index): the eval sampler's padding samples, a
# collate's or a token file's padding.
IGNORED = -100


def batches_per_epoch(batches: int, limit: int | float | None) -> int:
    """The training batches an epoch runs under trainer.limit_train_batches, as Lightning counts them: an int caps
    them, a float is a fraction of them (1.0 or null: all)."""
    if limit is None:
        return batches
    return min(batches, limit) if isinstance(limit, int) else int(batches * limit)
