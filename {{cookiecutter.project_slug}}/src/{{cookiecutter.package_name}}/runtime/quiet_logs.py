"""Silencing an upstream log line known to be harmless, by its logger and the start of its message (never a whole
logger), and the lines every engine silences. Each engine's engine/quiet.py adds its own."""

import logging
import re

HARMLESS_LOGS = {  # logger -> the starts of its harmless messages
    # torchao, imported by float8= and by transformers where it is installed: its wheel's compiled kernels that do not
    # load on this machine (CPU-only, another Python), and its Triton kernels without Triton. float8 training runs on
    # torch's own float8 matmul, not on these; before a refusal they were lines above the one-line error.
    "torchao": ("Failed to load ",),
    "torchao.kernel.intmm": ("Warning: Detected no triton",),
    # torch 2.10+ deprecates registering an Enum as a constant, which torchao does for its own enums at import.
    "torch.utils._pytree": ("<enum ",),
}
RANK_PREFIX = re.compile(r"^\[RANK \d+\] ")  # Accelerate's multi-process logger puts it before every message


class WithoutStart(logging.Filter):
    """Drops a record whose message (after a rank prefix) starts with one of `starts`."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not RANK_PREFIX.sub("", record.getMessage()).startswith(self.starts)


def silence_logs(logs: dict[str, tuple[str, ...]]) -> None:
    """Silence each logger's messages that start with one of its starts, and the lines every engine silences."""
    for name, starts in (HARMLESS_LOGS | logs).items():
        logging.getLogger(name).addFilter(WithoutStart(starts))
