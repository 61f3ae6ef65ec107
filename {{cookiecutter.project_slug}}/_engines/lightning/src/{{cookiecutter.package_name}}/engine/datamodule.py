"""The data as a LightningDataModule: data.loading.Data (any dataset), laid out by the Trainer's strategy."""

from typing import Any

import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader

from ..data.batch_sizes import per_device_batch_size
from ..data.loading import Data
from .strategies import data_parallel_rank, data_parallel_size


class DataModule(L.LightningDataModule):
    """Takes data.loading.Data's settings (configs/data/*.yaml). The loaders always carry their own seeded sampler over
    the data-parallel replicas: Lightning would insert its own under DDP, which always shuffles the training
    split and shards over all processes, not over the data-parallel replicas."""

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        self.data = Data(**settings)

    @property
    def batch_size(self) -> int:
        """The GLOBAL batch (the batch-size finder changes it)."""
        return self.data.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.data.batch_size = value

    @property
    def replicas(self) -> int:
        return data_parallel_size(self.trainer) if self.trainer is not None else 1

    @property
    def per_device_batch_size(self) -> int:
        return per_device_batch_size(self.data.batch_size, self.replicas)

    def setup(self, stage: str | None = None) -> None:
        self.data.setup()

    def _loader(self, split: str) -> DataLoader:
        rank = data_parallel_rank(self.trainer) if self.trainer is not None else 0
        on_gpu = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        per_node = self.trainer.num_devices if self.trainer is not None else 1
        accumulate = self.trainer.accumulate_grad_batches if self.trainer is not None else 1
        return self.data.loader(split, self.replicas, rank, on_gpu, per_node, accumulate)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
