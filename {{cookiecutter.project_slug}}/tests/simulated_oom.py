"""Out-of-memory errors as CUDA raises them, simulated deterministically on the CPU, for both engines' OOM tests
(Lightning: tests/oom_sim.py; Accelerate: tests/nets.py)."""

import torch


def simulated_oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class OOMInBackward(torch.autograd.Function):
    """The identity, whose backward runs out of memory: as the gradient of a large activation would."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise simulated_oom()
