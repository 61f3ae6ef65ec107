"""Callbacks, one per file, each usable on its own (configs/callbacks/<name>.yaml). The OOM toolkit's are all together
with `callbacks=oom`; what counts as an out-of-memory error is decided in one place, memory.py, shared by any engine."""
