"""The default data: deterministic from the seed, learnable, and split exactly over replicas."""

from types import SimpleNamespace

import pytest
import torch

from {{ cookiecutter.package_name }}.config import ConfigError
from {{ cookiecutter.package_name }}.data import SyntheticDataModule


def batches(datamodule, replicas=1, rank=0):
    datamodule.trainer = None
    if replicas > 1:  # what the data module reads from a trainer: its strategy's replica layout
        strategy = SimpleNamespace(data_parallel_size=replicas, data_parallel_rank=rank)
        datamodule.trainer = SimpleNamespace(strategy=strategy, accelerator=None, world_size=replicas, global_rank=rank)
    return list(datamodule.train_dataloader())


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = SyntheticDataModule(seed=1), SyntheticDataModule(seed=1), SyntheticDataModule(seed=2)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(a.splits["train"].tensors[0], b.splits["train"].tensors[0])
    assert torch.equal(a.splits["val"].tensors[1], b.splits["val"].tensors[1])
    assert not torch.equal(a.splits["train"].tensors[0], c.splits["train"].tensors[0])


def test_classes_are_balanced_enough_to_learn():
    dm = SyntheticDataModule(seed=0)
    dm.setup()
    counts = torch.bincount(dm.splits["train"].tensors[1], minlength=dm.hparams.num_classes)
    assert counts.min() > 0.3 * counts.float().mean(), counts.tolist()


def test_replicas_split_the_global_batch_exactly():
    dm = SyntheticDataModule(batch_size=64, shuffle=False, seed=0)
    dm.setup()
    single = batches(dm)[0]
    shards = [batches(dm, replicas=4, rank=rank)[0] for rank in range(4)]
    assert all(len(x) == 16 for x, _ in shards)
    together = torch.cat([x for x, _ in shards])
    assert sorted(together.sum(dim=1).tolist()) == pytest.approx(sorted(single[0].sum(dim=1).tolist()))


def test_indivisible_global_batch_is_refused():
    dm = SyntheticDataModule(batch_size=30)
    dm.setup()
    with pytest.raises(ConfigError, match="multiple of the 4 data-parallel replicas"):
        batches(dm, replicas=4)
