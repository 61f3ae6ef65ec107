"""What a run reports: its wandb run, the wandb files, and the epoch metrics the search reads."""
