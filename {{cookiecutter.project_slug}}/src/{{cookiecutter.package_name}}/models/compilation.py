"""compile=true: torch.compile of the network, in both engines and every preset but dp.

In place (`nn.Module.compile`): the net keeps its class and its parameter names, so checkpoints are the same with
compile on or off, and each preset wraps or shards the net as before. The compiler runs at the first step, on
the net as the preset laid it out. Under ddp the net is compiled before DistributedDataParallel wraps it;
torch.compile still sees DDP's buckets (its DDPOptimizer splits the graph at them), so gradients are all-reduced
while the backward runs. Presets that split the model (fsdp, model_parallel, pipeline) compile block by block after
sharding or cutting, as torchtitan does: the blocks share one code, compiled once, and the hooks that gather or
move a block's shards stay outside the compiled code.

Off by default: the first steps wait for the compiler (seconds to minutes, longest on a CPU), which a short run
never wins back. Turn it on for real trainings on GPUs.
"""

from torch import nn

from ..parallel.split import layers, split_net

DP_REFUSAL = (
    "strategy=dp does not support compile=true: nn.DataParallel copies the net into a thread per GPU at every "
    "step, which torch.compile does not speed up; use strategy=ddp"
)


def compile_net(net: nn.Module, per_block: bool) -> None:
    """Compile `net` in place, whole or (per_block, where it has a Split) each block of its Split; a no-op the second
    time. (fsdp shards a net without a Split as one unit, and compiles it whole.)"""
    if getattr(net, "_compiled", False):
        return
    if per_block and split_net(net) is not None:  # (the Split may be a submodule's: a wrapper of yours)
        inner, _, blocks, _ = layers(net, "compile=true")
        modules = [inner.get_submodule(name) for name in blocks]
    else:
        modules = [net]
    for module in modules:
        module.compile()
    net._compiled = True
