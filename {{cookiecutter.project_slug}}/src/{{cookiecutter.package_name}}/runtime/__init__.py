"""How a training runs on this machine: precision, hardware, memory, optimisation, resuming, metrics, the loss over
the real targets of a global batch."""
