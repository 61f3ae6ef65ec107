"""A callback for tests: each rank writes how many elements of each parameter it holds in memory, and
which parameters were real tensors (not on the meta device) before the model was sharded.

Used as `+callbacks.probe._target_=shard_probe.ShardProbe` (tests/ is on the trainings' PYTHONPATH).
"""

import json
from pathlib import Path

import lightning as L
from torch.distributed.tensor import DTensor


class ShardProbe(L.Callback):
    allocated_before_sharding: list[str] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning calls this before configure_model, where the net is sharded.
        self.allocated_before_sharding = [name for name, param in pl_module.named_parameters() if not param.is_meta]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        counts = {
            name: {
                "local": (param.to_local() if isinstance(param, DTensor) else param).numel(),
                "total": param.numel(),  # a DTensor reports its global shape
            }
            for name, param in pl_module.named_parameters()
        }
        counts["allocated_before_sharding"] = self.allocated_before_sharding
        path = Path(trainer.default_root_dir) / f"shards-rank{trainer.global_rank}.json"
        path.write_text(json.dumps(counts))
