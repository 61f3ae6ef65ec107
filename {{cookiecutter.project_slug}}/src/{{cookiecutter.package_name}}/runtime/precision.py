"""trainer.precision, the same flag and names in both engines (Lightning's): 32-true, bf16-mixed, 16-mixed (or 32,
bf16 and 16, as Lightning takes them), or auto (the default): bf16-mixed where every GPU of the machine computes in
bf16 natively (Ampere and later), else 32-true, so CPU runs and their tests stay exact fp32. And `tf32` (default
true): fp32 matmuls in TF32 on Ampere and later, what a GPU user would switch on anyway; false keeps them exact fp32
(the GPU check compares presets so)."""

import sys

import torch

from ..errors import ConfigError
from ..parallel.launcher import is_first_process
from .hardware import nvml_call

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
SHORT_NAMES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}  # Lightning's older names, still taken


def resolve_precision(precision: str | int, accelerator: str) -> str:
    """The precision a run uses: `auto` becomes bf16-mixed where the GPUs have bf16; 32 is 32-true (16: 16-mixed, bf16:
    bf16-mixed); 16-mixed on the CPU is bf16-mixed, said.

    Decided without initialising CUDA in this process: strategy=ddp_spawn (Accelerate) forks its processes
    afterwards, and a forked process cannot use CUDA once its parent has initialised it."""
    used = precision_used(precision, accelerator)
    if used not in PRECISIONS:
        raise ConfigError(f"trainer.precision={used} is unknown; valid: auto, {', '.join(PRECISIONS)}")
    if SHORT_NAMES.get(str(precision), precision) == "16-mixed" != used and is_first_process():
        # What Lightning's Trainer does on the CPU (fp16 autocast with a gradient scaler is for CUDA); accelerate
        # trained in fp16 there: the same flag, two other runs. Both engines now take bf16-mixed, and say so.
        print(
            "trainer.precision=16-mixed: the CPU trains in bf16-mixed instead (fp16 is for CUDA GPUs)", file=sys.stderr
        )
    return used


def precision_used(precision: str | int, accelerator: str) -> str:
    """What resolve_precision makes of `precision` on this machine, unchecked and unsaid (a run's config.yaml holds
    it so: a resume compares it with the command's)."""
    precision = SHORT_NAMES.get(str(precision), precision)
    on_gpu = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    if precision == "auto":
        return "bf16-mixed" if on_gpu and has_native_bf16(gpu_capabilities()) else "32-true"
    return "bf16-mixed" if precision == "16-mixed" and not on_gpu else precision


def gpu_capabilities() -> list[tuple[int, int]]:
    """The CUDA compute capability of every GPU of this machine, asked of NVML, which (unlike torch.cuda's
    queries) does not initialise CUDA; [] where NVML cannot tell."""
    if torch.version.hip:  # ROCm: every GPU torch supports computes in bf16
        return [(8, 0)] * torch.cuda.device_count()
    handles = [nvml_call("nvmlDeviceGetHandleByIndex", index) for index in range(nvml_call("nvmlDeviceGetCount") or 0)]
    if None in handles:
        return []
    capabilities = [nvml_call("nvmlDeviceGetCudaComputeCapability", handle) for handle in handles]
    return [] if None in capabilities else [tuple(capability) for capability in capabilities]


def has_native_bf16(capabilities: list[tuple[int, int]]) -> bool:
    """Whether every GPU computes in bf16 natively (compute capability 8.0+). Older GPUs emulate it, slowly, which
    torch.cuda.is_bf16_supported() counts as support."""
    return bool(capabilities) and min(capabilities) >= (8, 0)


def use_tensor_cores(tf32: bool) -> None:
    """tf32=true: fp32 matmuls in TF32 on Ampere and later GPUs (10 bits of mantissa, several times faster), what
    `torch.set_float32_matmul_precision("high")` asks for; nothing changes on the CPU or older GPUs. tf32=false:
    exact fp32 matmuls and convolutions (cuDNN convolutions use TF32 by default). Set in every training process:
    a spawned process does not inherit the setting."""
    if not tf32:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
    elif torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0):
        torch.set_float32_matmul_precision("high")
