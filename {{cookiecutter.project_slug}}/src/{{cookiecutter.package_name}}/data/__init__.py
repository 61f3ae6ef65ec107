"""Where samples come from and how they are laid out: loading (a split's loader per replica), sampling (the
seeded order a resumed run continues), batch_sizes (the batch arithmetic), checks (what the net cannot take); the
sources: synthetic (generated), tokens, files, streaming."""

# A class target no loss or metric counts (F.cross_entropy's ignore_index): the eval sampler's padding samples, a
# collate's or a token file's padding.
IGNORED = -100
