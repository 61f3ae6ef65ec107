"""The one layout every preset is a special case of, as both engines log it (the run config's `run.layout`):
replicas x shards x tensor_parallel x stages = the devices the run trains on.

- replicas: copies of the model that each read their slice of the global batch and average their gradients (ddp,
  dp's GPUs, HSDP's groups, pipelines side by side);
- shards: devices that each hold 1/shards of every weight, gradient and optimizer state (FSDP2);
- tensor_parallel: devices that split each block's weights by the model's Split plan;
- stages: devices that each hold consecutive blocks (pipeline positions, model_parallel's layer split).

single is 1 x 1 x 1 x 1, ddp N x 1 x 1 x 1, fsdp R x N/R x 1 x 1, model_parallel R x D/R x T x 1 (tensor mode) or
1 x 1 x 1 x L (layers mode), pipeline D x 1 x T x S. Each preset builds its own process groups (Lightning's and
Accelerate's strategies, torch's DeviceMesh); this is what they amount to, one vocabulary for every preset.
"""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Layout:
    replicas: int = 1
    shards: int = 1
    tensor_parallel: int = 1
    stages: int = 1

    @property
    def devices(self) -> int:
        return self.replicas * self.shards * self.tensor_parallel * self.stages

    def as_config(self) -> dict[str, int]:
        return {**asdict(self), "devices": self.devices}

    def __str__(self) -> str:
        return (
            f"{self.replicas} replicas x {self.shards} shards x {self.tensor_parallel} tensor-parallel x "
            f"{self.stages} stages = {self.devices} devices"
        )
