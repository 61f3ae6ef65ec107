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
