"""Command prefixes that start the multi-process presets, each on a free port (tests may run back to back)."""

import socket
import sys
from pathlib import Path

LAUNCH_CONFIG = Path(__file__).resolve().parents[1] / "launch" / "multi_process.yaml"


def free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def accelerate_launch(processes: int = 2) -> list[str]:
    """What the README says: accelerate launch with the shipped config (MULTI_GPU, which gives gloo on CPU)."""
    return [
        *(sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(LAUNCH_CONFIG)),
        *("--num_processes", str(processes), "--main_process_port", free_port(), "-m"),
    ]


def torchrun(processes: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{free_port()}", "-m"]  # fmt: skip


def torchrun_elastic(processes: int = 2, max_restarts: int = 2) -> list[str]:
    """torchrun restarting the whole group, up to `max_restarts` times, when a process dies."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
            f"--max-restarts={max_restarts}", "-m"]  # fmt: skip


def torchrun_node(nodes: int, endpoint: str, run_id: str) -> list[str]:
    """One node's torchrun agent (one process) of a multi-node launch: run it once per node, with the same
    rendezvous endpoint and id."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", "-m"]  # fmt: skip
