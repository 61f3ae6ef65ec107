"""The OOM toolkit for the Accelerate loop (`oom=toolkit`, configs/oom/, the settings the Lightning engine's callbacks
read too): recovery from an out-of-memory error in a training step (recovery.py), every device's memory on every
process logged each epoch (device_memory.py), and, opt-in (`oom.find_batch_size=true`), a batch-size search all
processes make together (batch_size_finder.py). The Lightning engine's algorithms and metric names; what counts as an
OOM error is runtime/memory.py's. (`.item()` at intervals needs nothing here: engine/loop.py only reads the loss on
logging steps, and sums oom.log_loss_mean's on the device.)"""
