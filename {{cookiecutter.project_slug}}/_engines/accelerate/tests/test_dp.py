"""strategy=dp: nn.DataParallel runs each replica of the net in a thread of its own, where the run's mixed precision
must be entered again (strategies/dp.py, AutocastReplica). On CPU dp runs on one device, so a replica's thread is
started here by hand; the last test runs real replicas on 2 GPUs."""

import threading

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch import nn

from {{ cookiecutter.package_name }}.engine.strategies.dp import AutocastReplica, DataParallel


class DtypeRecorder(nn.Module):
    """A Linear layer that records the device and dtype of what it computes (replicas share the list)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.seen: list[tuple[torch.device, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.seen.append((out.device, out.dtype))
        return out


@pytest.fixture
def bf16_accelerator():
    """An Accelerator of this process, bf16-mixed (on the CPU without a GPU), forgotten afterwards; an earlier
    in-process test's Accelerator (same pytest worker) is forgotten first, or its precision would be kept."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="bf16")
    AcceleratorState._reset_state(reset_partial_state=True)


def test_a_replica_in_its_own_thread_computes_in_the_runs_dtype(bf16_accelerator):
    """A new thread starts without autocast (nn.DataParallel's then enter CUDA's without a dtype: float16): the
    replica enters the run's own, here bf16 on the CPU."""
    net = DtypeRecorder()
    replica = AutocastReplica(net, bf16_accelerator.autocast)
    with bf16_accelerator.autocast():  # the main thread's, which the replica's thread does not inherit
        thread = threading.Thread(target=replica, args=(torch.randn(2, 8),))
        thread.start()
        thread.join()
    assert net.seen == [(torch.device("cpu"), torch.bfloat16)]


@pytest.mark.gpu(2)  # nn.DataParallel replicates only over 2 or more GPUs
def test_bf16_replicas_on_two_gpus_compute_in_bf16(bf16_accelerator):
    strategy = DataParallel()
    strategy.processes(launched=1, devices=2)
    net = DtypeRecorder()
    model, _ = strategy.prepare(bf16_accelerator, net, lambda params: torch.optim.SGD(params, lr=0.1))
    with bf16_accelerator.autocast():  # as train_step runs it
        model(torch.randn(8, 8, device="cuda"))
    assert sorted(set(net.seen), key=str) == [(torch.device("cuda", 0), torch.bfloat16),
                                              (torch.device("cuda", 1), torch.bfloat16)]  # fmt: skip
