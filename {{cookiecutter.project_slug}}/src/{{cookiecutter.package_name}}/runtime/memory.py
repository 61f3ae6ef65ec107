"""Out-of-memory handling that needs no training engine: what counts as an OOM error, how to give memory
back, how much memory a process holds. The OOM callbacks (and any other training loop) build on it."""

import gc
import math
import os
import resource
import sys
import warnings
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError, TrainingStopped

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


class OutOfMemoryStop(TrainingStopped):
    """Raised by the OOM recovery when out-of-memory errors keep coming (max_consecutive in a row): the step does
    not fit. `checkpoint`: where the state was saved before stopping, named in the message."""

    def __init__(self, consecutive: int, step: int, policy: str, policy_key: str) -> None:
        super().__init__(consecutive, step, policy, policy_key)
        self.checkpoint: object = None

    def __str__(self) -> str:
        consecutive, step, policy, policy_key = self.args
        split = f", or {policy_key}=split (the same batch in smaller micro-batches)" if policy == "skip" else ""
        saved = f"; checkpoint saved to {self.checkpoint}" if self.checkpoint else ""
        return (
            f"{consecutive} out-of-memory errors in a row at step {step} (policy {policy}): the step does not fit in "
            f"memory; lower data.batch_size{split}{saved}"
        )


# The presets the OOM recovery refuses, and why (said in the one-line refusal of either engine).
RECOVERY_REFUSED = {
    "dp": "its replicas run in threads of one process, which cannot redo a step on one of them",
    "fsdp": "each layer's forward gathers weights from every process: one out of memory would leave the rest waiting",
    "model_parallel": "its forward is a collective: a process out of memory mid-step would leave the others waiting",
    "pipeline": "its schedule already runs each batch as strategy.microbatches micro-batches; raise that instead",
}


# The presets the batch-size search refuses, and why (said in the one-line refusal of either engine).
FINDER_REFUSED = dict.fromkeys(
    ("fsdp", "model_parallel", "pipeline"),
    "its forward is a collective, which a process out of memory would leave the others waiting in",
)


def why_recovery_refuses(preset: str) -> str:
    """' (the reason)' why the OOM recovery refuses `preset`, for its one-line refusal; '' if none is known."""
    return f" ({RECOVERY_REFUSED[preset]})" if preset in RECOVERY_REFUSED else ""


def rng_state(device: torch.device) -> tuple:
    """The random generators a training step draws from (torch's CPU one, and the device's), so that a step
    redone after an out-of-memory error draws the same numbers (dropout) as its first try. A few microseconds."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def halved(micro_batch_size: int) -> int:
    """The next micro-batch size to try after an out-of-memory error: half, at least 1 sample."""
    return max(1, micro_batch_size // 2)


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


def process_memory_figures(devices: Sequence[torch.device]) -> tuple[list[str], list[list[float]]]:
    """(figure names, one row of figures per device) for every device this process uses: each GPU of dp or
    layer-split model parallelism has its own row; CPU devices share the process's one RSS row."""
    gpus = list(dict.fromkeys(device for device in devices if device.type == "cuda"))
    rows = [device_memory_figures(device) for device in gpus] or [device_memory_figures(torch.device("cpu"))]
    return list(rows[0]), [list(row.values()) for row in rows]


def memory_metrics(names: list[str], gathered: list[list[list[float]]]) -> dict[str, float]:
    """gathered[rank][device][figure] as metrics: memory/rank<r>/<figure> for a process on one device,
    memory/rank<r>/device<d>/<figure> for one on several; memory/imbalance is max / min of the first figure
    (peak allocated on CUDA, RSS elsewhere) over every device of every rank: GPU 0 filling first shows."""
    metrics = {}
    for rank, rows in enumerate(gathered):
        for index, row in enumerate(rows):
            prefix = f"memory/rank{rank}" + (f"/device{index}" if len(rows) > 1 else "")
            metrics.update({f"{prefix}/{name}": value for name, value in zip(names, row, strict=True)})
    first = [row[0] for rows in gathered for row in rows]
    metrics["memory/imbalance"] = max(first) / min(first) if min(first) > 0 else float("inf")
    return metrics


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


def search(fits: Callable[[int], bool], start: int, maximum: int, tolerance: float = 0.05) -> tuple[int, int]:
    """Largest size in [1, maximum] for which fits(size) holds, to within `tolerance` of it.

    Doubles from `start` until a size fails, then bisects between the last fit and the first failure.
    Returns (size, trials); size 0 means not even 1 fits.
    """
    low, high = 0, maximum + 1  # low: largest known to fit; high: smallest known to fail
    size, trials = max(1, min(start, maximum)), 0
    while True:  # grow by powers of two
        trials += 1
        if not fits(size):
            high = size
            break
        low = size
        if size == maximum:
            break
        size = min(2 * size, maximum)
    while high - low > max(1.0, tolerance * low):  # then bisect
        middle = (low + high) // 2
        trials += 1
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, trials


# How the batch-size finder scales the learning rate with the global batch (oom.batch_size_finder.lr_scaling): the
# factor for a global batch `ratio` times the configured one.
LR_SCALINGS: dict[str, Callable[[float], float]] = {"none": lambda ratio: 1.0, "linear": float, "sqrt": math.sqrt}


# configs/oom/'s settings (each preset has every one).
OOM_SETTINGS = ("recovery", "find_batch_size", "batch_size_finder", "log_memory", "log_loss_mean")


def check_oom_settings(oom: Any) -> None:
    """configs/oom/'s values, which both engines read, refused in one line before training (a wrong value would
    surface as a traceback in the middle of a training, or, for a policy, at its first out-of-memory error)."""
    if unknown := sorted(set(oom) - set(OOM_SETTINGS)):  # (a key added to configs/oom/: read by nothing)
        raise ConfigError(f"oom.{unknown[0]} is not a setting; valid: {', '.join(OOM_SETTINGS)}")
    recovery, finder = oom.recovery, oom.batch_size_finder
    if recovery is not None and not isinstance(recovery, Mapping):  # (oom.recovery=split: "oom.recovery.i")
        raise ConfigError(
            f"oom.recovery={_shown(recovery)}: oom.recovery is a group of settings; give oom=toolkit for the recovery, "
            "oom.recovery.policy=skip|split for its policy, or oom.recovery=null to switch it off"
        )
    if recovery:
        if unknown := sorted(set(recovery) - {"policy", "max_consecutive", "empty_cache_every_n_epochs"}):
            raise ConfigError(
                f"oom.recovery.{unknown[0]} is not a setting; valid: policy, max_consecutive, "
                "empty_cache_every_n_epochs"
            )
        if recovery.get("policy", "split") not in ("skip", "split"):
            raise ConfigError(f"oom.recovery.policy={_shown(recovery.policy)} is unknown; valid: skip, split")
        _at_least("oom.recovery.max_consecutive", recovery.get("max_consecutive", 3), 1)
        _at_least("oom.recovery.empty_cache_every_n_epochs", recovery.get("empty_cache_every_n_epochs", 0), 0)
    if unknown := sorted(set(finder) - {"max_batch_size", "margin", "tolerance", "steps_per_trial", "lr_scaling"}):
        raise ConfigError(
            f"oom.batch_size_finder.{unknown[0]} is not a setting; valid: max_batch_size, margin, "
            "tolerance, steps_per_trial, lr_scaling"
        )
    _at_least("oom.batch_size_finder.max_batch_size", finder.max_batch_size, 1)
    _at_least("oom.batch_size_finder.steps_per_trial", finder.steps_per_trial, 1)
    for name, example in (("margin", 0.1), ("tolerance", 0.05)):
        value = finder[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise ConfigError(
                f"oom.batch_size_finder.{name}={_shown(value)}: give a fraction in [0, 1), e.g. {example}"
            )
    if finder.lr_scaling not in LR_SCALINGS:
        raise ConfigError(
            f"oom.batch_size_finder.lr_scaling={_shown(finder.lr_scaling)} is unknown; valid: {', '.join(LR_SCALINGS)}"
        )


def _at_least(key: str, value: Any, least: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
        raise ConfigError(f"{key}={_shown(value)}: give a whole number, {least} or more")


def _shown(value: Any) -> str:
    """A value as the command line writes it (null, not Python's None)."""
    return "null" if value is None else str(value)


def with_margin(largest: int, maximum: int, margin: float) -> int:
    """The per-device batch a search uses: `margin` below the largest that fitted (real batches and later steps vary),
    or the search's cap itself where it fitted (nothing ran out of memory: no margin is needed)."""
    return largest if largest == maximum else max(1, min(maximum, int(largest * (1 - margin))))


def changed_batch_message(old_global: int, new_global: int, train_samples: int) -> str:
    """What a batch-size search did to the optimisation, for its log line."""
    message = f"global batch {old_global} -> {new_global} (x{new_global / old_global:.3g})"
    if new_global == old_global:
        return message + ": the optimisation is unchanged"
    return (
        message + ": this changes the optimisation (the steps per epoch, and the learning rate that suits them; "
        f"capped at the {train_samples} training samples)"
    )
