"""The Lightning engine: the LightningModule and DataModule, checkpoints, logger, callbacks and strategies."""

from .quiet import silence_harmless_messages

# Here, so that every process of a training has it: also those that only unpickle the engine's objects (ddp_spawn).
silence_harmless_messages()
