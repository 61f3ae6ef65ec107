"""The data: a synthetic, learnable classification task, and the one way every engine loads it.

Samples are Gaussian vectors; labels are the argmax of a fixed random "teacher" network.
Everything is generated from the seed, so every process and every run sees the same data
without a download. Replace `_make_split` (or the whole class) to use your own data.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .config import ConfigError


class SyntheticData:
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
        self.batch_size = batch_size  # GLOBAL: samples per optimizer step over all data-parallel replicas
        self.num_features, self.num_classes = num_features, num_classes
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.shuffle, self.num_workers, self.seed = shuffle, num_workers, seed
        self.splits: dict[str, TensorDataset] = {}

    def setup(self) -> None:
        """Generate the splits (once; every process generates the same ones from the seed)."""
        if self.splits:
            return
        generator = torch.Generator().manual_seed(self.seed)
        teacher = nn.Sequential(nn.Linear(self.num_features, 64), nn.Tanh(), nn.Linear(64, self.num_classes))
        with torch.no_grad():  # small weights, zero biases: a smooth rule with balanced classes
            for layer in (teacher[0], teacher[2]):
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.5 / layer.in_features**0.5)
                layer.bias.zero_()
        for name, size in self.sizes.items():
            self.splits[name] = self._make_split(teacher, size, generator)

    @staticmethod
    @torch.no_grad()
    def _make_split(teacher: nn.Module, size: int, generator: torch.Generator) -> TensorDataset:
        x = torch.randn(size, teacher[0].in_features, generator=generator)
        return TensorDataset(x, teacher(x).argmax(dim=-1))

    def loader(self, split: str, replicas: int = 1, rank: int = 0, pin_memory: bool = False) -> DataLoader:
        """This data-parallel replica's loader of `split`: `rank`'s share of each global batch.

        The same seeded sampler for every layout, one replica included: each global batch is then the same
        samples whatever the strategy or engine, shuffled or not. The training split drops its last partial
        batch, so every optimizer step sees a full global batch, as on a single device.
        """
        self.setup()
        train = split == "train"
        dataset = self.splits[split]
        sampler = DistributedSampler(
            dataset, num_replicas=replicas, rank=rank, shuffle=train and self.shuffle, seed=self.seed, drop_last=train
        )
        return DataLoader(
            dataset,
            batch_size=per_device_batch_size(self.batch_size, replicas),
            sampler=sampler,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=pin_memory,  # page-locked host memory makes host-to-GPU copies faster
        )


def per_device_batch_size(global_batch_size: int, replicas: int) -> int:
    """The global batch divided over the data-parallel replicas; a clear error if it does not divide."""
    if global_batch_size < 1 or global_batch_size % replicas:
        raise ConfigError(
            f"data.batch_size={global_batch_size} is the global batch and must be a positive multiple of the "
            f"{replicas} data-parallel replicas; nearest valid: {nearest_multiples(global_batch_size, replicas)}"
        )
    return global_batch_size // replicas


def nearest_multiples(value: int, factor: int) -> str:
    below = max(factor, value // factor * factor)
    return f"{below} or {below + factor}"
