"""The Lightning engine: the LightningModule and DataModule, checkpoints, logger, callbacks and strategies."""
