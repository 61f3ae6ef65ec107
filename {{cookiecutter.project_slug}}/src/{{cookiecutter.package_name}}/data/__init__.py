"""Where samples come from: loading (the batch arithmetic), generated data, token data, files, streaming."""

# A class target no loss or metric counts (F.cross_entropy's ignore_index): the eval sampler's padding samples, a
# collate's or a token file's padding.
IGNORED = -100
