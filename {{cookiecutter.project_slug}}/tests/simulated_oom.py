"""Out-of-memory errors as CUDA raises them, simulated deterministically on the CPU, for both engines' OOM tests
(Lightning: tests/oom_sim.py; Accelerate: tests/nets.py); and a net that meets real ones early on a GPU."""

import torch

from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP


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


class MemoryCappedMLP(ResidualMLP):
    """ResidualMLP whose process may use only `cuda_mib` MiB of its GPU: past it, torch's caching allocator raises
    a real torch.OutOfMemoryError, at the same batch size on any GPU (model.net._target_=simulated_oom.<it>)."""

    def __init__(self, *args, cuda_mib: int = 1024, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if torch.cuda.is_available():
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.set_per_process_memory_fraction(cuda_mib * 2**20 / total)


class GradientsHeldMLP(ResidualMLP):
    """ResidualMLP on a device of `budget` units, a memory model for the batch-size finder's CPU tests: a forward of
    B samples needs B units, and `gradient_units` more while the gradients of the step before are still held
    (Lightning's loop frees them only before the backward); past the budget, a torch.OutOfMemoryError."""

    def __init__(self, *args, budget: int = 300, gradient_units: int = 100, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.budget, self.gradient_units = budget, gradient_units

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        held = any(parameter.grad is not None for parameter in self.parameters())
        if self.training and len(x) + (self.gradient_units if held else 0) > self.budget:
            raise simulated_oom()
        return super().forward(x)


class SavedActivationsMLP(ResidualMLP):
    """ResidualMLP on a device with `budget_kib` KiB for the activations a training forward saves for the backward
    (counted as autograd saves them; the weights are not counted): a memory model that activation checkpointing
    changes, as it changes a GPU's. Past the budget, a torch.OutOfMemoryError."""

    def __init__(self, *args, budget_kib: int = 32, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.budget = budget_kib * 2**10

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(x)
        weights = {parameter.untyped_storage().data_ptr() for parameter in self.parameters()}
        saved = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            if tensor.untyped_storage().data_ptr() not in weights:
                saved += tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = super().forward(x)
        if saved > self.budget:
            raise simulated_oom()
        return out
