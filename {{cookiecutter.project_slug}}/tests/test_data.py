"""The default data: deterministic from the seed, learnable, and split exactly over replicas."""

import pytest
import torch

from {{ cookiecutter.package_name }}.config import ConfigError
from {{ cookiecutter.package_name }}.data import SyntheticData


def first_batch(data: SyntheticData, replicas: int = 1, rank: int = 0) -> torch.Tensor:
    x, _ = next(iter(data.loader("train", replicas, rank)))
    return x


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = SyntheticData(seed=1), SyntheticData(seed=1), SyntheticData(seed=2)
    for data in (a, b, c):
        data.setup()
    assert torch.equal(a.splits["train"].tensors[0], b.splits["train"].tensors[0])
    assert torch.equal(a.splits["val"].tensors[1], b.splits["val"].tensors[1])
    assert not torch.equal(a.splits["train"].tensors[0], c.splits["train"].tensors[0])


def test_classes_are_balanced_enough_to_learn():
    data = SyntheticData(seed=0)
    data.setup()
    counts = torch.bincount(data.splits["train"].tensors[1], minlength=data.num_classes)
    assert counts.min() > 0.3 * counts.float().mean(), counts.tolist()


@pytest.mark.parametrize("shuffle", [False, True])
def test_replicas_split_the_global_batch_exactly(shuffle):
    data = SyntheticData(batch_size=64, shuffle=shuffle, seed=0)
    single = first_batch(data)
    shards = [first_batch(data, replicas=4, rank=rank) for rank in range(4)]
    assert all(len(x) == 16 for x in shards)
    together = torch.cat(shards)
    assert sorted(together.sum(dim=1).tolist()) == pytest.approx(sorted(single.sum(dim=1).tolist()))


def test_indivisible_global_batch_is_refused():
    with pytest.raises(ConfigError, match="multiple of the 4 data-parallel replicas; nearest valid: 28 or 32"):
        SyntheticData(batch_size=30).loader("train", replicas=4)
