"""Out-of-memory handling that needs no training engine: what counts as an OOM error, how to give memory
back, how much memory a process holds. The OOM callbacks (and any other training loop) build on it."""

import gc
import os
import resource
import sys
import warnings
from collections.abc import MutableMapping

import torch

# Messages of allocators that do not raise torch.OutOfMemoryError (older torch, cuDNN, the CPU allocator).
OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED",  # what cuDNN raises when it cannot get a workspace
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory",
    "MPS backend out of memory",
)


def is_oom_error(error: BaseException) -> bool:
    """True for torch.OutOfMemoryError whatever its message, and for the known OOM messages."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(message in str(error) for message in OOM_MESSAGES)


def free_memory() -> None:
    """Collect garbage and return cached blocks to the device. Call it outside the `except` block:
    inside it the traceback still references the failed step's tensors."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def rss_mb() -> float:
    """This process's resident memory now, in MiB (Linux; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / (2**20 if sys.platform == "darwin" else 2**10)


def device_memory_figures(device: torch.device) -> dict[str, float]:
    """CUDA: peak allocated and peak reserved MiB since the last call. Elsewhere: the process's resident memory."""
    if device.type == "cuda":
        figures = {
            "peak_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
        }
        torch.cuda.reset_peak_memory_stats(device)  # the next period's peak, not the run's
        return figures
    return {"rss_mb": rss_mb()}


def memory_summary(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.memory_summary(device, abbreviated=True)
    return f"process RSS {rss_mb():.0f} MiB"


def allocator_env_names(torch_version: str = torch.__version__) -> tuple[str, ...]:
    """The variables the installed torch's CUDA caching allocator reads: PYTORCH_ALLOC_CONF since torch 2.9
    (the old name still works there, with a deprecation warning), only PYTORCH_CUDA_ALLOC_CONF before."""
    major, minor = (int(part) for part in torch_version.split(".")[:2])
    return ("PYTORCH_ALLOC_CONF",) if (major, minor) >= (2, 9) else ("PYTORCH_CUDA_ALLOC_CONF",)


def configure_allocator(environ: MutableMapping[str, str] = os.environ) -> None:
    """Ask the CUDA caching allocator for expandable segments (less fragmentation, fewer OOMs). It reads its
    variable once, when CUDA initialises: both engines call this first thing; a user's value wins."""
    if any(name in environ for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")):
        return
    if not torch.cuda.is_available():
        return
    if torch.cuda.is_initialized():
        warnings.warn("CUDA already initialised: expandable_segments:True not applied", stacklevel=2)
        return
    for name in allocator_env_names():
        environ[name] = "expandable_segments:True"
