"""Upstream messages known to be harmless, silenced one by one, by exact message and module (never a whole category),
so that a training's console holds what the user needs. Imported by engine/__init__.py: every process of a training
imports it, spawned ones too."""

import logging
import warnings

HARMLESS_WARNINGS = [  # (message regex, the module that warns)
    # strategy=ddp_spawn on CPUs: Accelerate sets one thread per physical core and process itself, and says so.
    (r"OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at \d+ to improve oob performance", r"accelerate\.state"),
]
HARMLESS_LOGS = {  # logger -> the start of its message (after Accelerate's "[RANK n] ")
    # A model with tied weights (the GPT's head and embedding): safetensors stores the shared tensor once and
    # load_model ties it again; tests/test_gpt.py reloads such a checkpoint and compares every weight.
    "accelerate.utils.other": "Removed shared tensor",
}


class _Without(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().split("] ", 1)[-1].startswith(self.start)


def silence_harmless_messages() -> None:
    for message, module in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, module=module)
    for name, start in HARMLESS_LOGS.items():
        logging.getLogger(name).addFilter(_Without(start))
