"""The Accelerate engine: the training loop, checkpoints, the OOM toolkit, logger and strategies."""

from .quiet import silence_harmless_messages

# Here, so that every process of a training has it, also those a launcher or ddp_spawn starts.
silence_harmless_messages()
