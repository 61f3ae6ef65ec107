"""Metrics both engines compute the same way."""

import math


def perplexity(mean_loss: float) -> float:
    """exp of the mean cross-entropy; inf past what a float holds (a diverged run logs it instead of crashing)."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf
