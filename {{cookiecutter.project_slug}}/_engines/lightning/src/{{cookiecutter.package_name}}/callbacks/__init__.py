"""The OOM toolkit: one callback per file, each usable on its own (configs/callbacks/<name>.yaml), all together
with `callbacks=oom`. What counts as an out-of-memory error is decided in one place, memory.py, shared by any engine."""
