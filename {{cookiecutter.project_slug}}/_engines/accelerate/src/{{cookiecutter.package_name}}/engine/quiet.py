"""Upstream messages known to be harmless, silenced one by one, by exact message and module (never a whole category),
so that a training's console holds what the user needs. Imported by engine/__init__.py: every process of a training
imports it, spawned ones too."""

import warnings

from ..runtime.quiet_logs import silence_logs

HARMLESS_WARNINGS = [  # (message regex, the module that warns)
    # strategy=ddp_spawn on CPUs: Accelerate sets one thread per physical core and process itself, and says so.
    (r"OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at \d+ to improve oob performance", r"accelerate\.state"),
]
HARMLESS_LOGS = {  # logger -> the starts of its messages (after Accelerate's "[RANK n] "); more in runtime/quiet_logs
    # A model with tied weights (the GPT's head and embedding): safetensors stores the shared tensor once and
    # load_model ties it again; tests/test_gpt.py reloads such a checkpoint and compares every weight.
    "accelerate.utils.other": ("Removed shared tensor",),
}


def silence_harmless_messages() -> None:
    for message, module in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, module=module)
    silence_logs(HARMLESS_LOGS)
