"""The OOM toolkit's callbacks, built from configs/oom/ (`oom=toolkit`): the settings the Accelerate engine's loop
reads too, each part a callback of its own file here, each turned off by its own key."""

from typing import Any

import lightning as L

from ...runtime.memory import check_oom_settings
from .batch_size_finder import BatchSizeFinder
from .device_memory import DeviceMemoryMonitor
from .item_logger import ItemMetricLogger
from .oom_recovery import OOMRecovery


def oom_callbacks(oom: Any) -> list[L.Callback]:
    """The callbacks `oom` turns on (each class names its setting, and how to turn it off, in its refusals)."""
    check_oom_settings(oom)
    callbacks: list[L.Callback] = [OOMRecovery(**oom.recovery)] if oom.recovery else []
    callbacks += [ItemMetricLogger()] if oom.log_loss_mean else []
    callbacks += [DeviceMemoryMonitor()] if oom.log_memory else []
    return callbacks + ([BatchSizeFinder(**oom.batch_size_finder)] if oom.find_batch_size else [])
