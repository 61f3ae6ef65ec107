"""trainer.precision, the same flag and names in both engines (Lightning's): 32-true, bf16-mixed, 16-mixed, or
auto (the default): bf16-mixed on a CUDA GPU that has bf16 (Ampere and later), else 32-true, so CPU runs and
their tests stay exact fp32. And what a GPU user would switch on anyway: TF32 matmuls on Ampere and later."""

import torch

from .config import ConfigError

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")


def resolve_precision(precision: str | int, accelerator: str) -> str:
    """The precision a run uses: `auto` becomes bf16-mixed where a CUDA GPU with bf16 will run it; 32 is 32-true."""
    if str(precision) == "32":
        return "32-true"
    if precision == "auto":
        on_gpu = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
        return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"
    if precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={precision} is unknown; valid: auto, {', '.join(PRECISIONS)}")
    return precision


def use_tensor_cores() -> None:
    """fp32 matmuls in TF32 on Ampere and later GPUs (10 bits of mantissa, several times faster): what
    `torch.set_float32_matmul_precision("high")` asks for. Nothing changes on the CPU or older GPUs."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0):
        torch.set_float32_matmul_precision("high")
