"""What this machine has: versions, devices, how the GPUs are linked (NVML), and a measured all-reduce bandwidth.

Every function returns plain dicts and lists (they go into doctor.json as they are). Where something cannot be
known here (no GPU, no NVML), the answer says why instead of being empty without a reason.
"""

import functools
import os
import re
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import ConfigError
from ..parallel.launcher import free_port

try:  # NVML's maintained binding is the nvidia-ml-py package; it installs the `pynvml` module
    import pynvml
except ImportError:  # pragma: no cover - a dependency of the project, but the doctor should still run
    pynvml = None


def check_device_settings(accelerator: str, devices: Any, gpu_indices: bool = False) -> None:
    """trainer.accelerator=gpu (or cuda) where torch sees no GPU, and a trainer.devices that is not a device count, in
    one line each (both engines: Lightning's words named neither the setting nor what is valid; accelerate trained on
    the CPU). `gpu_indices`: the engine also takes a list of GPU indices (Lightning's devices=[0, 1])."""
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():  # (NVML's answer: CUDA stays untouched)
        raise ConfigError(
            f"trainer.accelerator={accelerator}, but torch sees no CUDA device (a CPU build of torch, or no GPU "
            "visible); use trainer.accelerator=cpu or auto"
        )
    listed = isinstance(devices, list | tuple) or type(devices).__name__ == "ListConfig"
    listed = listed and all(type(i) is int and i >= 0 for i in devices)
    written = isinstance(devices, str) and re.fullmatch(r"\d+(,\d*)*", devices)  # Lightning's "0,1" and "1,"
    indices = gpu_indices and accelerator != "cpu" and (listed or written)
    if devices not in ("auto", -1) and not (type(devices) is int and devices >= 1) and not (indices and devices):
        also = ", or GPU indices ([0, 1])" if gpu_indices else ""
        if isinstance(devices, str) and devices.isdigit():  # trainer.devices='2' (or a ${oc.env:...}): text
            raise ConfigError(
                f"trainer.devices='{devices}' is text, not a device count: give trainer.devices={devices}"
            )
        if not gpu_indices and (listed or written):  # GPU indices, which this engine does not take
            chosen = ",".join(str(i) for i in devices) if listed else devices.rstrip(",")
            also = f"; choose GPUs with CUDA_VISIBLE_DEVICES={chosen} and trainer.devices=<their count>"
        raise ConfigError(f"trainer.devices={devices} is not a device count; valid: 1, 2, ..., or auto (or -1){also}")


def oversubscribed_note(processes: int) -> str | None:
    """A note when more training processes run on this machine's CPU than it has cores to give them: it trains, but
    every collective waits for processes the kernel has not scheduled (each step slower than one process's)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if processes <= cores:
        return None
    return (
        f"note: {processes} training processes on the CPU of a machine with {cores} cores: each step waits for "
        f"processes that have no core; trainer.devices={cores} or fewer trains faster here"
    )


def environment() -> dict[str, Any]:
    """Versions and devices: torch, CUDA, NCCL, the driver, and each GPU with memory, compute capability, bf16."""
    cuda = torch.cuda.is_available()
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda and dist.is_nccl_available() else None,
        "driver": nvml_call("nvmlSystemGetDriverVersion"),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "host_memory_gb": host_memory_bytes() / 1e9,
        "gpus": [],
        "why_no_gpus": None if cuda else "torch sees no CUDA device (a CPU build of torch, or no GPU visible)",
    }
    for index in range(torch.cuda.device_count() if cuda else 0):
        props = torch.cuda.get_device_properties(index)
        gpu = {
            "index": index,  # torch's (CUDA's) numbering: the visible GPUs, in CUDA_VISIBLE_DEVICES order
            "name": props.name,
            **identity(props),
            "memory_gb": props.total_memory / 1e9,
            "compute_capability": f"{props.major}.{props.minor}",
            "bf16": props.major >= 8,  # Ampere and later compute in bf16 natively
        }
        env["gpus"].append({**gpu, **gpu_usage(gpu)})
    return env


def identity(props: Any) -> dict[str, str]:
    """What names a GPU to NVML as well as to CUDA (torch.cuda.get_device_properties): its UUID and its PCI bus
    id, written as NVML writes them (GPU-<uuid>, DDDDDDDD:BB:DD.0)."""
    return {
        "uuid": f"GPU-{props.uuid}",
        "pci_bus_id": f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0",
    }


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@functools.cache
def nvml_ready() -> str | None:
    """None if NVML answers, else why not (asked once per process)."""
    if pynvml is None:
        return "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return f"NVML is not available ({err}): no NVIDIA driver on this machine"
    return None


def nvml_call(name: str, *args: Any) -> Any:
    """pynvml.<name>(*args), or None where NVML (or that query on this GPU or driver) is unavailable."""
    if nvml_ready() is not None or not hasattr(pynvml, name):
        return None
    try:
        answer = getattr(pynvml, name)(*args)
    except pynvml.NVMLError:
        return None
    return answer.decode() if isinstance(answer, bytes) else answer  # older bindings return bytes


def nvml_handle(gpu: dict[str, Any]) -> Any:
    """NVML's handle of a GPU torch sees, or None. Found by UUID, else by PCI bus id (a MIG instance's UUID is not
    its GPU's), never by index: NVML numbers every GPU of the machine, CUDA only the visible ones, in
    CUDA_VISIBLE_DEVICES order, so the same number can be another GPU."""
    handle = nvml_call("nvmlDeviceGetHandleByUUID", gpu["uuid"])
    return handle if handle is not None else nvml_call("nvmlDeviceGetHandleByPciBusId", gpu["pci_bus_id"])


def gpu_usage(gpu: dict[str, Any]) -> dict[str, Any]:
    """Memory in use and utilisation now (imbalance and idle GPUs are the first things to fix)."""
    handle = nvml_handle(gpu)
    if handle is None:
        return {}
    memory = nvml_call("nvmlDeviceGetMemoryInfo", handle)
    rates = nvml_call("nvmlDeviceGetUtilizationRates", handle)
    return {
        "memory_used_gb": memory.used / 1e9 if memory else None,
        "utilization_percent": rates.gpu if rates else None,
        "numa_node": nvml_call("nvmlDeviceGetNumaNodeId", handle),
    }


# NVML's name for the closest point two GPUs' paths meet at, from close to far.
TOPOLOGY_LEVELS = {
    0: "same board",  # NVML_TOPOLOGY_INTERNAL
    10: "PCIe switch",  # SINGLE
    20: "PCIe switches",  # MULTIPLE
    30: "PCIe host bridge",  # HOSTBRIDGE
    40: "same NUMA node",  # NODE
    50: "across sockets (SMP interconnect)",  # SYSTEM
}


def topology(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """For each pair of `gpus` (environment()'s, in torch's numbering): NVLink links between them (or through an
    NVSwitch), the PCIe path, NUMA/socket, P2P."""
    result: dict[str, Any] = {"pairs": [], "why_empty": nvml_ready(), "nccl_env": nccl_env()}
    if result["why_empty"] is None and len(gpus) < 2:
        result["why_empty"] = f"{len(gpus)} GPU visible to torch: no device pairs to link"
    if result["why_empty"] is not None:
        return result
    handles = [nvml_handle(gpu) for gpu in gpus]
    if None in handles:
        lost = gpus[handles.index(None)]
        result["why_empty"] = f"NVML finds no GPU with the UUID or PCI bus id of torch's GPU {lost['index']}"
        return result
    bus_ids = [getattr(nvml_call("nvmlDeviceGetPciInfo", h), "busId", None) for h in handles]
    links = [nvlinks(h) for h in handles]
    count = len(gpus)
    for a in range(count):
        for b in range(a + 1, count):
            level = nvml_call("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
            p2p = nvml_call("nvmlDeviceGetP2PStatus", handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_READ)
            direct = links[a][0].count(bus_ids[b]) if bus_ids[b] is not None else 0
            switched = links[a][1] if links[b][1] else 0  # both GPUs must reach the NVSwitches
            result["pairs"].append(
                {
                    "gpus": [gpus[a]["index"], gpus[b]["index"]],
                    "nvlinks": direct,
                    "nvswitch_links": switched,
                    "link": f"NVLink x{direct}" if direct else f"NVSwitch x{switched}" if switched else "PCIe",
                    "pcie_path": TOPOLOGY_LEVELS.get(level, str(level)) if level is not None else None,
                    "same_socket": level is not None and level < 50,
                    "p2p": p2p == pynvml.NVML_P2P_STATUS_OK if p2p is not None else None,
                }
            )
    return result


def nvlinks(handle: Any) -> tuple[list[str], int]:
    """A GPU's active NVLinks: the PCI bus ids of the GPUs they end at (one per link), and how many end at an
    NVSwitch (which reaches every GPU on it)."""
    peers, switched = [], 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if nvml_call("nvmlDeviceGetNvLinkState", handle, link) != pynvml.NVML_FEATURE_ENABLED:
            continue
        if nvml_call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switched += 1
        elif remote := getattr(nvml_call("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle, link), "busId", None):
            peers.append(remote)
    return peers, switched


def nccl_env() -> dict[str, str]:
    """The NCCL_* settings in force (they change which links NCCL uses: NCCL_P2P_DISABLE, NCCL_IB_HCA, ...)."""
    return {name: value for name, value in sorted(os.environ.items()) if name.startswith("NCCL_")}


def measure_allreduce(sizes_bytes: list[int], iterations: int, processes: int | None = None) -> dict[str, Any]:
    """All-reduce bandwidth over message sizes, as nccl-tests reports it.

    One process per GPU over NCCL, or 2 CPU processes over gloo without GPUs (what gloo reaches through memory,
    not a network). algbw = bytes / time; busbw = algbw x 2(n-1)/n, the traffic each link carries in a ring,
    comparable across process counts. nccl-tests itself needs a CUDA build; these processes are torch's.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus >= 2 else "gloo"
    n = processes or (gpus if gpus >= 2 else 2)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "allreduce.json"
        port = free_port()
        mp.start_processes(
            _allreduce_worker,
            args=(n, backend, port, sizes_bytes, iterations, str(out)),
            nprocs=n,
            start_method="spawn",
        )
        seconds = [float(line) for line in out.read_text().split()]
    rows = []
    for size, time_s in zip(sizes_bytes, seconds, strict=True):
        algbw = size / time_s / 1e9
        rows.append({"bytes": size, "time_us": time_s * 1e6, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n})
    return {"backend": backend, "processes": n, "device": "cuda" if backend == "nccl" else "cpu", "sizes": rows}


def _allreduce_worker(rank: int, n: int, backend: str, port: int, sizes: list[int], iterations: int, out: str) -> None:
    from datetime import timedelta

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=n, timeout=timedelta(minutes=2))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    medians = []
    for size in sizes:
        tensor = torch.ones(max(size // 4, 1), dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # warm-up: connections and buffers
        times = []
        for _ in range(iterations):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        slowest = [0.0] * n  # a collective takes as long as its slowest rank
        dist.all_gather_object(slowest, statistics.median(times))
        medians.append(max(slowest))
    if rank == 0:
        Path(out).write_text("\n".join(map(str, medians)))
    dist.destroy_process_group()
