"""The default data: a synthetic, learnable classification task, generated in-process from the seed.

Samples are Gaussian vectors; labels are the argmax of a fixed random "teacher" network. Every process and
every run sees the same data without a download. A map-style Dataset of one split, as data.loading.Data expects.
"""

import functools

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..errors import ConfigError


class SyntheticData(TensorDataset):
    def __init__(
        self,
        split: str,
        num_features: int = 32,
        num_classes: int = 8,
        train_size: int = 8192,
        val_size: int = 1024,
        test_size: int = 1024,
        seed: int = 0,
    ) -> None:
        sizes = {"train": train_size, "val": val_size, "test": test_size}
        if split not in sizes:
            raise ValueError(f"split={split!r}; valid: {', '.join(sizes)}")
        # (a negative size or class count was a traceback; 0 features or 1 class a task of one label, learnt
        # "perfectly": accuracy 1.0, exit 0)
        for name, value, least in (
            *((f"{name}_size", size, 0) for name, size in sizes.items()),  # (an empty split: refused where read)
            ("num_features", num_features, 1),
            ("num_classes", num_classes, 2),
        ):
            if type(value) is not int or value < least:
                raise ConfigError(f"data.{name}={value} must be a whole number >= {least} (the synthetic task's)")
        # One generator for the teacher and all splits in order: each split is the same whichever is asked for.
        generator = torch.Generator().manual_seed(seed)
        teacher = nn.Sequential(nn.Linear(num_features, 64), nn.Tanh(), nn.Linear(64, num_classes))
        with torch.no_grad():  # small weights, zero biases: a smooth rule with balanced classes
            for layer in (teacher[0], teacher[2]):
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.5 / layer.in_features**0.5)
                layer.bias.zero_()
            for name, size in sizes.items():
                x = torch.randn(size, num_features, generator=generator)
                if name == split:
                    super().__init__(x, teacher(x).argmax(dim=-1))
                    return


def data_settings(batch_size: int = 256, shuffle: bool = True, seed: int = 0, num_workers: int = 0, **task) -> dict:
    """data.loading.Data's settings for this task, as configs/data/synthetic.yaml gives them, for code that builds the
    data without Hydra (tests, benchmarks): Data(**data_settings(batch_size=64, train_size=512))."""
    return {
        "dataset": functools.partial(SyntheticData, seed=seed, **task),
        "batch_size": batch_size,
        "shuffle": shuffle,
        "seed": seed,
        "num_workers": num_workers,
        **task,
    }
