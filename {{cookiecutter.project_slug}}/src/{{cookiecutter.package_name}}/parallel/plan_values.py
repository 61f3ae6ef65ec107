"""The tensor-parallel plan checked by its values before training: a plan whose layers divide well can still change
what the net computes (a normalisation over the features between a ColwiseParallel layer and the RowwiseParallel one
after it sees each rank's share of them; a colwise layer with no rowwise after it hands the next layer a share),
and trains with other losses than one device's, without an error. torch has no such check: the plan is run here over
simulated ranks, in this one process, with torch's LocalTensorMode over a fake process group (both private torch
APIs, so the check is skipped where they are missing or cannot run the forward)."""

import copy
import logging
import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from ..errors import ConfigError
from .split import find_split, tensor_parallel_plan

# The check holds a second copy of the net in host memory and runs it over every rank: bigger nets are not checked.
MOST_PARAMETERS = 100_000_000
ADVICE = (
    "what runs between a ColwiseParallel layer and the RowwiseParallel one after it must work feature by feature "
    "(docs/your-model.md), or use strategy=fsdp"
)


def check_plan_values(build: Callable[[], nn.Module], example: object, tensor_parallel_size: int) -> None:
    """Refuse a tensor-parallel plan under which the net's output on `example` (a sample, as a batch of one) is not
    the unsharded net's, over `tensor_parallel_size` ranks; eval mode, no gradients. `build` makes the net (on the
    CPU, leaving the random state as it was). Not checked: a net over MOST_PARAMETERS parameters, an example that is
    not one tensor, a forward that draws random numbers in eval mode, a process group already started."""
    tp = tensor_parallel_size
    if tp < 2 or not isinstance(example, torch.Tensor) or dist.is_initialized():
        return
    with torch.device("meta"):
        if sum(p.numel() for p in build().parameters()) > MOST_PARAMETERS:
            return
    with torch.random.fork_rng(devices=[]):  # the training's own net is drawn from the same random state
        net, split = find_split(build(), "model_parallel")
    if not split.tensor_parallel:
        return
    net.eval()
    with torch.no_grad():
        try:
            expected, again = net(example), net(example)
        except Exception:  # the net's own forward fails on the sample: the checks of the data and the output say why
            return
        if not isinstance(expected, torch.Tensor) or not torch.equal(expected, again):  # it draws: not compared
            return
        outputs = simulated_outputs(net, tensor_parallel_plan(net, "model_parallel"), example, tp)
    if outputs is None:
        return
    name = type(net).__name__
    if shapes := [tuple(out.shape) for out in outputs if out.shape != expected.shape]:
        raise ConfigError(
            f"the tensor-parallel plan of {name} leaves each of its {tp} ranks a share of the output ({shapes[0]} "
            f"of {tuple(expected.shape)}): end it with a RowwiseParallel layer, or give the last colwise one "
            "output_layouts=Replicate()"
        )
    worst = max((out.float() - expected.float()).abs().max().item() for out in outputs)
    scale = expected.float().abs().max().item()
    if not math.isfinite(worst) or worst > 1e-4 * (1 + scale):
        raise ConfigError(
            f"the tensor-parallel plan of {name} changes what it computes: over {tp} ranks, its output on one sample "
            f"differs from the unsharded net's by {worst:.2g} (of values up to {scale:.2g}); {ADVICE}"
        )


def simulated_outputs(net: nn.Module, plan: dict, example: torch.Tensor, tp: int) -> list[torch.Tensor] | None:
    """Each simulated rank's output of a copy of `net` sharded by `plan` over `tp` ranks; None where torch's private
    APIs are missing or cannot run the forward. A shape error there is the plan's: refused."""
    try:
        from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend
    except ImportError:
        return None
    sharded = copy.deepcopy(net)
    fake_tensors = logging.getLogger("torch._subclasses.fake_tensor")  # logs the simulation's errors, raised below
    level = fake_tensors.level
    fake_tensors.setLevel(logging.CRITICAL)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        with LocalTensorMode(tp):
            parallelize_module(sharded, init_device_mesh("cpu", (tp,)), plan)
            output = sharded(example)
            output = output.full_tensor() if isinstance(output, DTensor) else output
            return [output._local_tensors[rank] for rank in range(tp)] if isinstance(output, LocalTensor) else [output]
    except RuntimeError as err:  # a share of the features met a layer sized for all of them (a LayerNorm, say)
        if not any(word in str(err) for word in ("shape", "size", "dim")):
            return None  # what the simulation cannot run; the training itself shows what is wrong, if anything
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"the tensor-parallel plan of {type(net).__name__} fails over {tp} ranks on one sample ({first_line}): "
            f"{ADVICE}"
        ) from None
    except Exception:
        return None
    finally:
        dist.destroy_process_group()
        fake_tensors.setLevel(level)
