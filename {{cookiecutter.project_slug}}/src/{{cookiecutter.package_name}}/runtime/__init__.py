"""How a training runs on this machine: precision, hardware, memory, optimisation, resuming, metrics."""
