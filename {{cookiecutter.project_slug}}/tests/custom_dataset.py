"""A dataset class of a user's own, for `data=custom data.dataset._target_=custom_dataset.Parity` (tests/ is on the
trainings' PYTHONPATH): a map-style Dataset constructed once per split with `split=` and its own keys."""

import shutil

import numpy as np
import torch
from torch.utils.data import Dataset


class Parity(Dataset):
    """Is the sum of a vector's signs even? Each split drawn from its own seed."""

    def __init__(
        self, split: str, size: int, num_features: int = 6, label_dtype: str = "int64", nan_at: int | None = None
    ) -> None:
        generator = torch.Generator().manual_seed(["train", "val", "test"].index(split))
        self.x = torch.randn(size, num_features, generator=generator)
        self.y = ((self.x > 0).sum(dim=1) % 2).to(getattr(torch, label_dtype))
        if nan_at is not None and split == "train":  # a NaN the checks before training do not read (past 64)
            self.x[nan_at, 0] = float("nan")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


class RemovesAFolder(Parity):
    """Parity that removes `folder` as its training split is built: a checkpoint given as ckpt_path=, removed by the
    running training that wrote it while this one starts."""

    def __init__(self, split: str, size: int, folder: str) -> None:
        super().__init__(split, size)
        if split == "train":
            shutil.rmtree(folder)


class NoisyParity(Parity):
    """Parity whose every read adds fresh noise (torch's and numpy's random numbers), as an augmentation in loader
    worker processes does."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().__getitem__(index)
        noise = torch.randn_like(x) * 0.3 + torch.from_numpy(np.random.normal(0, 0.3, x.shape)).to(x.dtype)
        return x + noise, y


class DictItems(Parity):
    """Items as dicts ({"x": ..., "y": ...}), which the training does not take: it takes (x, y) pairs."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = super().__getitem__(index)
        return {"x": x, "y": y}


class TwoViews(Parity):
    """x of two tensors, (the vector, its square): a model of two inputs."""

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        x, y = super().__getitem__(index)
        return (x, x * x), y


class VariableLength(Dataset):
    """Sequences of 2 to 7 steps of num_features each (x: (length, num_features)), each step labelled by the sign of
    its sum (y: (length,)), as a tagger's or a language model's targets: torch's default collate cannot stack them;
    pad_batch does, so each batch, and each replica's share of it, holds its own amount of padding."""

    def __init__(self, split: str, size: int, num_features: int = 4) -> None:
        generator = torch.Generator().manual_seed(["train", "val", "test"].index(split))
        lengths = torch.randint(2, 8, (size,), generator=generator).tolist()
        self.x = [torch.randn(length, num_features, generator=generator) for length in lengths]
        self.y = [(x.sum(dim=1) > 0).long() for x in self.x]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def pad_batch(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """data.collate_fn=custom_dataset.pad_batch: the sequences zero-padded to the batch's longest, their labels
    padded with -100 (left out of the loss and the metrics)."""
    xs, ys = zip(*samples, strict=True)
    pad = torch.nn.utils.rnn.pad_sequence
    return pad(list(xs), batch_first=True), pad(list(ys), batch_first=True, padding_value=-100)


class Images(Dataset):
    """Images of 3 x 8 x 8 with one of 4 labels, as a vision dataset gives them (not flat vectors); flipped at
    random."""

    def __init__(self, split: str, size: int = 16) -> None:
        generator = torch.Generator().manual_seed(["train", "val", "test"].index(split))
        self.x = torch.rand(size, 3, 8, 8, generator=generator)
        self.y = torch.randint(4, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        flip = torch.rand(()).item() < 0.5  # an augmentation deciding on a random number (a CPU one)
        return self.x[index].flip(-1) if flip else self.x[index], self.y[index]


class Values(Parity):
    """A regression: the float target of each vector is the sum of its features."""

    def __init__(self, split: str, size: int, num_features: int = 6) -> None:
        super().__init__(split, size, num_features)
        self.y = self.x.sum(dim=1)


class Saved(Dataset):
    """Each split's samples read from root/<split>.pt (a dict of x and y), as a dataset of files of a user's own."""

    def __init__(self, split: str, root: str) -> None:
        saved = torch.load(f"{root}/{split}.pt")
        self.x, self.y = saved["x"], saved["y"]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]
