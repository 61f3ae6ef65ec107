"""Spreading a training over devices: sharding (FSDP2/TP), pipelining, model splits, BatchNorm sync, launchers."""
