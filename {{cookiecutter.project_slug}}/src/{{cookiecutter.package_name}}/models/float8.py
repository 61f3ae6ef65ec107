"""float8=tensorwise|rowwise: the Linear layers of the model's blocks compute their matrix multiplications in float8
on GPUs with float8 tensor cores (compute capability 8.9+: H100, H200, L40S), through torchao's float8 training (the
library torchtitan and Accelerate use). Off by default (none).

- tensorwise: one scale per tensor; the fastest.
- rowwise: one scale per row; closer to bf16, a little slower.

Only the blocks' Linear layers big enough to gain are converted (torchao's filter for the recipe: both sizes
multiples of 16 and above its measured thresholds); the embedding and the head stay in bf16 (as torchtitan keeps its
output layer), small layers too. Converted before the preset shards or wraps the net, so FSDP2 shards float8 layers
and compile=true compiles them (compile is what makes float8 fast: without it the casts are separate kernels). The
weights stay float32 parameters with the same names: checkpoints are the same with float8 on or off.
"""

from torch import nn

from ..errors import ConfigError
from ..parallel.split import layers, require_split
from ..runtime.precision import gpu_capabilities

RECIPES = ("none", "tensorwise", "rowwise")
FLOAT8_CAPABILITY = (8, 9)
PRESETS = (
    "single",
    "ddp",
    "ddp_spawn",
    "fsdp",
    "model_parallel",
)  # model_parallel: FSDP2 only (tensor_parallel_size=1)


def check_float8(recipe: str, preset: str, accelerator: str, tensor_parallel_size: int = 1) -> None:
    """Refuse, before training, a recipe that is unknown or cannot run here, in one line."""
    if recipe not in RECIPES:
        raise ConfigError(f"float8={recipe} is unknown; valid: {', '.join(RECIPES)}")
    if recipe == "none":
        return
    if preset not in PRESETS or tensor_parallel_size > 1:
        raise ConfigError(
            f"float8={recipe} runs under strategy={'|'.join(PRESETS)} (model_parallel with tensor_parallel_size=1, "
            f"FSDP2), not strategy={preset}"
            + (f" with tensor_parallel_size={tensor_parallel_size}" if tensor_parallel_size > 1 else "")
            + "; or leave float8=none"
        )
    capabilities = [] if accelerator == "cpu" else gpu_capabilities()  # NVML: leaves CUDA uninitialised
    if not capabilities or min(capabilities) < FLOAT8_CAPABILITY:
        here = "no GPU" if not capabilities else f"compute capability {'.'.join(map(str, min(capabilities)))}"
        raise ConfigError(
            f"float8={recipe} needs GPUs with float8 tensor cores (compute capability 8.9+: H100, H200, L40S); this "
            f"run has {here}: leave float8=none"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise ConfigError(f"float8={recipe} needs torchao: pip install torchao") from None


def float8_layers(net: nn.Module, recipe: str) -> list[str]:
    """The names of the Linear layers of the Split's blocks that gain from float8 under `recipe` (torchao's filter:
    both sizes multiples of 16 and above the thresholds it measured on H100s)."""
    require_split(net, f"float8={recipe}", "converts the Linear layers of the blocks of")
    from torchao.float8 import _auto_filter_for_recipe

    gains = _auto_filter_for_recipe(recipe, filter_fqns=[])
    split_net, _, blocks, _ = layers(net, f"float8={recipe}")
    in_blocks = {id(module) for block in blocks for module in split_net.get_submodule(block).modules()}
    return [name for name, module in net.named_modules() if id(module) in in_blocks and gains(module, name)]


def check_float8_layers(net: nn.Module, recipe: str) -> None:
    """Refuse a model none of whose layers would compute in float8 (too small to gain: float8 would change nothing)."""
    if recipe != "none" and not float8_layers(net, recipe):
        raise ConfigError(
            f"float8={recipe} converts no layer of {type(net).__name__}: the Linear layers of its blocks are too "
            "small to gain from float8 (torchao's thresholds: thousands of features, e.g. model=gpt with "
            "model.net.dim=2048); leave float8=none"
        )


def convert_float8(net: nn.Module, recipe: str) -> list[str]:
    """Swap the blocks' Linear layers that gain from float8 for torchao's Float8Linear, in place (on any device,
    the meta device included); the names of the converted layers."""
    if recipe == "none" or getattr(net, "_float8", None):  # Lightning sets the model up again for its test
        return []
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    names = set(float8_layers(net, recipe))
    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(net, config=config, module_filter_fn=lambda module, name: name in names)
    net._float8 = recipe
    return sorted(names)
