"""A made-up machine's NVML, standing in for the `pynvml` module (nvidia-ml-py) where there is no NVIDIA driver:
the GPUs, their links and their numbers are the fake; the code that asks NVML (hardware.py, precision.py) is real.

NVML numbers every GPU of the machine; CUDA (and torch) only the visible ones, in CUDA_VISIBLE_DEVICES order.
`torch_properties` gives what torch.cuda.get_device_properties would say for the visible GPUs.
"""

from dataclasses import dataclass
from types import SimpleNamespace


@dataclass
class FakeGPU:
    uuid: str  # as NVML writes it: GPU-<uuid>
    domain: int
    bus: int
    memory_used: int  # bytes
    numa_node: int
    nvlinks: tuple[str, ...] = ()  # where each active NVLink ends: a GPU's PCI bus id, or "switch" (an NVSwitch)
    capability: tuple[int, int] = (9, 0)

    @property
    def bus_id(self) -> str:
        return f"{self.domain:08X}:{self.bus:02X}:00.0"


class FakeNVML:
    """Module-like: monkeypatch hardware.pynvml with an instance. Constants as nvidia-ml-py defines them."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5

    class NVMLError(Exception):
        pass

    def __init__(
        self,
        gpus: list[FakeGPU],
        ancestors: dict[frozenset[int], int] | None = None,  # NVML index pair -> NVML_TOPOLOGY_* level
        p2p: set[frozenset[int]] = frozenset(),  # NVML index pairs that can read each other's memory
        driver: bool = True,  # False: nvmlInit fails, as on a machine without the NVIDIA driver
        count_fails: bool = False,  # nvmlDeviceGetCount fails (NVML answers some queries, not others)
    ) -> None:
        self.gpus, self.ancestors, self.p2p = gpus, ancestors or {}, p2p
        self.driver, self.count_fails = driver, count_fails

    def torch_properties(self, visible: list[int]) -> list[SimpleNamespace]:
        """What torch reports for CUDA_VISIBLE_DEVICES=<visible>: torch's GPU i is NVML's GPU visible[i]."""
        return [
            SimpleNamespace(
                uuid=self.gpus[i].uuid.removeprefix("GPU-"),
                pci_domain_id=self.gpus[i].domain,
                pci_bus_id=self.gpus[i].bus,
                pci_device_id=0,
            )
            for i in visible
        ]

    def _find(self, test, what: str) -> FakeGPU:
        if not self.driver:
            raise self.NVMLError("Uninitialized")
        for gpu in self.gpus:
            if test(gpu):
                return gpu
        raise self.NVMLError(f"Not Found: {what}")

    def _index(self, gpu: FakeGPU) -> int:
        return self.gpus.index(gpu)

    def nvmlInit(self) -> None:
        if not self.driver:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        if self.count_fails:
            raise self.NVMLError("Unknown Error")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGPU:
        return self._find(lambda gpu: self._index(gpu) == index, f"index {index}")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGPU:
        return self._find(lambda gpu: gpu.uuid == uuid, uuid)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> FakeGPU:
        return self._find(lambda gpu: gpu.bus_id == bus_id.upper(), bus_id)

    def nvmlDeviceGetPciInfo(self, gpu: FakeGPU) -> SimpleNamespace:
        return SimpleNamespace(busId=gpu.bus_id)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGPU) -> SimpleNamespace:
        return SimpleNamespace(used=gpu.memory_used)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGPU) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._index(gpu) * 10)

    def nvmlDeviceGetNumaNodeId(self, gpu: FakeGPU) -> int:
        return gpu.numa_node

    def nvmlDeviceGetCudaComputeCapability(self, gpu: FakeGPU) -> tuple[int, int]:
        return gpu.capability

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGPU, b: FakeGPU) -> int:
        return self.ancestors[frozenset((self._index(a), self._index(b)))]

    def nvmlDeviceGetP2PStatus(self, a: FakeGPU, b: FakeGPU, caps: int) -> int:
        pair = frozenset((self._index(a), self._index(b)))
        return self.NVML_P2P_STATUS_OK if pair in self.p2p else self.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGPU, link: int) -> int:
        if link >= len(gpu.nvlinks):
            raise self.NVMLError("Not Supported")  # as NVML answers for a link the GPU does not have
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, gpu: FakeGPU, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=gpu.nvlinks[link])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: FakeGPU, link: int) -> int:
        switch = gpu.nvlinks[link] == "switch"
        return self.NVML_NVLINK_DEVICE_TYPE_SWITCH if switch else self.NVML_NVLINK_DEVICE_TYPE_GPU
