"""The OOM toolkit: one callback per file, each usable on its own (configs/callbacks/<name>.yaml),
all together with `callbacks=oom`. oom.py is the one place that decides what an out-of-memory error is."""
