"""Your data from files (`data=files data.dir=DIR`): DIR holds train, val and optionally test, each as .npz
(arrays x, y) or .pt (a dict of tensors x, y). x: one sample per row, of any shape; y: integer class labels,
one per sample (or one per position, e.g. next tokens).

The shapes the model needs are read from the files, not typed: configs/data/files.yaml fills data.num_features
and data.num_classes with the `data_files` resolver, and the model config interpolates those. A model that
takes samples unflattened (data.flatten=false) can read their shape with ${data_files:${data.dir},sample_shape}.
Every problem with the files is a ConfigError naming the file, raised when the config is first resolved; integer
samples are refused by data.check_input unless the model reads token ids (it knows the model).
"""

import functools
import math
import re
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigError
from . import IGNORED

FORMATS = (".npz", ".pt")
CHUNK = 65536  # samples checked at a time for NaN or infinite values
NARROW_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.uint32)
SPARSE_FROM = 100_000  # classes (largest label + 1) from which the labels are checked for ids far apart


class FilesDataset(TensorDataset):
    """One split read from data.dir, checked. `flatten` makes each sample one vector (what the classifier's MLP
    takes); false keeps the shape it has in the file."""

    def __init__(self, split: str, dir: str, flatten: bool = True) -> None:
        describe(dir)  # every split checked, and against each other
        self.path = split_file(dir, split)  # named in data.check_input's refusals
        x, y = read_split(self.path)
        super().__init__(x.reshape(len(x), -1) if flatten else x, y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return as_trained(*super().__getitem__(index))


def as_trained(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A sample as the training takes it. Token ids stored narrow (uint16, the usual; uint8, int16, uint32): an
    embedding takes int64 (or int32), and cross-entropy int64 labels. Converted per sample, so the files' compact
    arrays are what stays in memory."""
    return (x.long() if x.dtype in NARROW_INTEGERS else x), y.long()


def describe(dir: str | None) -> dict:
    """What the model needs to know about the data in `dir`: num_features (values per sample), sample_shape,
    num_classes (largest label + 1 over all splits) and splits (the ones present). Cached: it reads the files."""
    if not dir:
        raise ConfigError("data.dir is not set: data=files data.dir=DIR, DIR holding train and val (.npz or .pt)")
    return _describe(str(Path(dir).expanduser().resolve()))


@functools.cache
def _describe(dir: str) -> dict:
    if not Path(dir).is_dir():
        raise ConfigError(f"{dir}: not a directory (data.dir must hold train and val, .npz or .pt)")
    splits = ["train", "val"] + (["test"] if _candidates(dir, "test") else [])
    shape, classes, labels = None, 0, []
    for split in splits:
        path = split_file(dir, split)
        x, y = read_split(path)
        if shape is None:
            shape, train_path, label_shape = x.shape[1:], path, y.shape[1:]
        elif x.shape[1:] != shape or y.shape[1:] != label_shape:
            raise ConfigError(
                f"{path}: samples are shaped x {list(x.shape[1:])}, y {list(y.shape[1:])}; {train_path.name}'s are "
                f"x {list(shape)}, y {list(label_shape)}"
            )
        check_finite_file(path, x)  # here, once per split and process (its dataset reads the file again)
        ids, labels_range = split_ranges(path, (x, y))
        if labels_range and labels_range[0] < 0:  # (-100: padding, left out of loss and metrics)
            raise ConfigError(
                f"{path}: y has negative labels ({labels_range[0]}); classes are 0, 1, ... (-100: padding)"
            )
        classes = max(classes, labels_range[1] + 1 if labels_range else 0)
        if ids and x.shape == y.shape:  # token sequences (model=gpt): x's ids are classes too
            classes = max(classes, ids[1] + 1)
        elif classes > SPARSE_FROM:
            labels.append(torch.unique(y))
    if labels:
        labels = torch.unique(torch.cat(labels))
        check_labels_numbered(labels[labels != IGNORED], classes, dir)
    return {"num_features": math.prod(shape), "sample_shape": list(shape), "num_classes": classes, "splits": splits}


def check_labels_numbered(labels: torch.Tensor, classes: int, dir: str) -> None:
    """Labels that are ids far apart (raw category codes, say), not classes numbered from 0: one output per id up to
    the largest made a head of millions of outputs for a few classes (a training killed for its memory)."""
    if len(labels) * 100 < classes:
        raise ConfigError(
            f"{dir}: the labels are {len(labels)} distinct ids from {int(labels[0])} to {classes - 1}, and each id up "
            f"to the largest is a class: the net's head would have {classes} outputs. Number the classes 0 to "
            f"{len(labels) - 1} in the files (np.unique(y, return_inverse=True) gives the new labels)"
        )


Range = tuple[int, int]  # (smallest, largest)


def value_range(values: torch.Tensor, ignored: int | None = None) -> Range | None:
    """(smallest, largest) of integer `values` but `ignored` (-100 targets), of any width, a chunk of samples at a
    time (about 4M values: no copy of a memory-mapped file, nor of a long sequence's whole split); None where there
    are none."""
    lows, highs = [], []
    rows = max(1, (1 << 22) // max(1, values[0].numel())) if len(values) else 1
    for chunk in values.split(rows):
        chunk = chunk.long()
        if ignored is not None:
            chunk = chunk[chunk != ignored]
        if chunk.numel():
            lows.append(int(chunk.min()))
            highs.append(int(chunk.max()))
    return (min(lows), max(highs)) if lows else None


_RANGES: dict[Path, tuple[Range | None, Range | None]] = {}  # by file: what describe read, for the checks


def split_ranges(path: Path, arrays: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[Range | None, ...]:
    """The ranges of a split file's integer x (None for floats) and of its y but -100, read once per process (from
    `arrays`, the file's x and y, when they are at hand): for the vocabulary's size (describe) and the checks
    before training (data/checks.py), which read it again otherwise."""
    key = path.resolve()
    if key not in _RANGES:
        x, y = arrays or read_split(path)
        _RANGES[key] = (None if x.is_floating_point() else value_range(x)), value_range(y, IGNORED)
    return _RANGES[key]


def resolve(dir: str | None, key: str) -> object:
    """The `data_files` resolver: ${data_files:DIR,num_features|sample_shape|num_classes|splits}."""
    return described_field(describe(dir), "data_files", key)


def described_field(facts: dict, resolver: str, key: str) -> object:
    """One of the facts a resolver reads about the data (`key`), refused in one line if it is not one of them."""
    if key not in facts:
        spelled = "${" + f"{resolver}:DIR,{key}" + "}"  # (as the config spells it)
        raise ConfigError(f"{spelled}: {key} is not a field it reads; valid: {', '.join(facts)}")
    return facts[key]


def _candidates(dir: str, split: str) -> list[Path]:
    return [path for path in (Path(dir) / f"{split}{suffix}" for suffix in FORMATS) if path.is_file()]


def split_file(dir: str, split: str) -> Path:
    found = _candidates(dir, split)
    if not found:
        other = sorted(path.name for path in Path(dir).glob(f"{split}.*"))  # train.csv, train.npy, ...
        unread = f" ({', '.join(other)}: not a format it reads: save x and y with numpy.savez or torch.save)"
        needs = f"data=files needs train and val{unread if other else ''}"
        raise ConfigError(f"{Path(dir) / split}.npz: not found (nor {split}.pt); {needs}")
    if len(found) > 1:
        raise ConfigError(f"{found[0]}: {found[1].name} is there too; keep one {split} file")
    return found[0]


def read_split(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """x and y of one file, checked: tensors, as many samples in both, integer labels (describe, which every reader
    calls first, checks them >= 0, or -100, with the ranges it reads)."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                arrays = {name: torch.from_numpy(npz[name]) for name in npz.files if name in ("x", "y")}
                names = npz.files
        else:  # memory-mapped: the file is read as samples are used
            arrays = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            names = list(arrays) if isinstance(arrays, dict) else []
    except Exception as err:  # not an archive, pickled objects, a truncated file, ...
        if found := re.search(r"Unsupported global: GLOBAL (\S+)", str(err)):  # torch's words: a page on weights_only
            raise ConfigError(
                f"{path}: cannot be read: it pickles {found.group(1)} (numpy arrays, say), which torch.load reads only "
                "from a file you trust (weights_only=False); save x and y as tensors (torch.save({'x': "
                "torch.as_tensor(x), 'y': torch.as_tensor(y)}, path)) or as .npz (np.savez)"
            ) from None
        raise ConfigError(f"{path}: cannot be read ({type(err).__name__}: {str(err).splitlines()[0]})") from err
    if not isinstance(arrays, dict) or not {"x", "y"} <= set(arrays):
        raise ConfigError(f"{path}: needs x and y; it has {', '.join(map(str, names)) or 'neither'}")
    x, y = arrays["x"], arrays["y"]
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor) or value.ndim == 0:
            raise ConfigError(f"{path}: {name} must be an array with one row per sample, not {type(value).__name__}")
    if len(x) != len(y):
        raise ConfigError(f"{path}: x has {len(x)} samples, y has {len(y)}")
    if len(x) == 0:
        raise ConfigError(f"{path}: no samples")
    for name, value in (("x", x), ("y", y)):
        if value[0].numel() == 0:  # (token sequences of length 0: the vocabulary's size failed on an empty max())
            raise ConfigError(
                f"{path}: {name} is shaped {list(value.shape)}: each sample holds no value; give one or more"
            )
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ConfigError(f"{path}: y is {str(y.dtype).removeprefix('torch.')}; class labels must be integers")
    if x.dtype == torch.float64:  # numpy's default; the model's weights are float32
        x = x.float()
    return x, y


def check_finite_file(path: Path, x: torch.Tensor) -> None:
    """Refuse NaN or infinite values in a .npz file's x, read whole already (a memory-mapped .pt: the checks before
    training read its first samples); in chunks, so that no mask as big as x is made."""
    if path.suffix != ".npz" or not x.is_floating_point():
        return
    for start in range(0, len(x), CHUNK):
        chunk = x[start : start + CHUNK]
        if not bool(torch.isfinite(chunk).all()):
            first = start + int((~torch.isfinite(chunk.reshape(len(chunk), -1))).any(dim=1).nonzero()[0])
            raise ConfigError(f"{path}: x has NaN or infinite values (sample {first} first), which make the loss NaN")
