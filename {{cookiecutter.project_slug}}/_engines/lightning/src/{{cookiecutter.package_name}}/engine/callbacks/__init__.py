"""Callbacks, one per file. The OOM toolkit's (oom_recovery, item_logger, device_memory, batch_size_finder) are
built from configs/oom/ by oom_toolkit.py; what counts as an out-of-memory error is decided in one place,
runtime/memory.py, shared by both engines."""
