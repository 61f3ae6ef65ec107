"""The Accelerate engine: the training loop, checkpoints, the OOM toolkit, logger and strategies."""
