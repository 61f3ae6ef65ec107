"""The data: a LightningDataModule over a synthetic, learnable classification task.

Samples are Gaussian vectors; labels are the argmax of a fixed random "teacher" network.
Everything is generated from the seed, so every process and every run sees the same data
without a download. Replace `_make_split` (or the whole class) to use your own data.
"""

import lightning as L
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .strategies import data_parallel_rank, data_parallel_size, per_device_batch_size


class SyntheticDataModule(L.LightningDataModule):
    def __init__(
        self,
        batch_size: int = 256,
        num_features: int = 32,
        num_classes: int = 8,
        train_size: int = 8192,
        val_size: int = 1024,
        test_size: int = 1024,
        shuffle: bool = True,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.splits: dict[str, TensorDataset] = {}

    def prepare_data(self) -> None:
        # Runs once per node before setup(): download or preprocess real data here.
        pass

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        hp = self.hparams
        generator = torch.Generator().manual_seed(hp.seed)
        teacher = nn.Sequential(nn.Linear(hp.num_features, 64), nn.Tanh(), nn.Linear(64, hp.num_classes))
        with torch.no_grad():  # small weights, zero biases: a smooth rule with balanced classes
            for layer in (teacher[0], teacher[2]):
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.5 / layer.in_features**0.5)
                layer.bias.zero_()
        for name, size in (("train", hp.train_size), ("val", hp.val_size), ("test", hp.test_size)):
            self.splits[name] = self._make_split(teacher, size, generator)

    @staticmethod
    @torch.no_grad()
    def _make_split(teacher: nn.Module, size: int, generator: torch.Generator) -> TensorDataset:
        x = torch.randn(size, teacher[0].in_features, generator=generator)
        return TensorDataset(x, teacher(x).argmax(dim=-1))

    @property
    def replicas(self) -> int:
        return data_parallel_size(self.trainer) if self.trainer is not None else 1

    @property
    def per_device_batch_size(self) -> int:
        """The global batch divided over the data-parallel replicas."""
        return per_device_batch_size(self.hparams.batch_size, self.replicas)

    def _loader(self, split: str, shuffle: bool = False, drop_last: bool = False) -> DataLoader:
        dataset = self.splits[split]
        sampler = None
        if self.trainer is not None and self.trainer.world_size > 1:
            # Our own sampler whenever several processes run, because Lightning's always shuffles the training
            # split (so data.shuffle=false would not hold) and shards over all processes, not over the
            # data-parallel replicas only (all stages of a pipeline read the same batch).
            sampler = DistributedSampler(
                dataset,
                num_replicas=self.replicas,
                rank=data_parallel_rank(self.trainer),
                shuffle=shuffle,
                seed=self.hparams.seed,
                drop_last=drop_last,
            )
        on_gpu = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        return DataLoader(
            dataset,
            batch_size=self.per_device_batch_size,
            shuffle=shuffle and sampler is None,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            pin_memory=on_gpu,  # page-locked host memory makes host-to-GPU copies faster
        )

    def train_dataloader(self) -> DataLoader:
        # drop_last: every optimizer step sees a full global batch, as on a single device.
        return self._loader("train", shuffle=self.hparams.shuffle, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
