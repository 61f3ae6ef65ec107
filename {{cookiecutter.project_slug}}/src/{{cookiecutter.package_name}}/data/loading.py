"""The one way every engine loads data: a map-style Dataset per split, and each data-parallel replica's loader.

The dataset comes from the config (`data.dataset._target_`, constructed once per split as `Class(split=NAME,
**its keys)`): synthetic.py's generated task by default, files.py's arrays with `data=files`, or any map-style
torch Dataset of yours. Everything below it (the global batch split over replicas, the seeded order, exact
mid-epoch resume, worker processes) is the same for all of them. `data=streaming` (streaming.py) is the one
exception: its training split is a stream that litdata's loader deals out and keeps the position of.
"""

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..errors import ConfigError, located
from .batch_sizes import per_device_batch_size
from .sampling import (
    EvalSampler,
    ResumableLoader,
    ResumableSampler,
    SeededSamples,
    WithPadding,
    leave_ctrl_c_to_the_training,
)

SPLITS = ("train", "val", "test")


class Data:
    """A dataset per split and the loaders of it.

    `dataset` is called as dataset(split=NAME) once per split in `splits` (the config gives a Hydra partial).
    The preset's other keys (data.dir, data.num_features, data.train_size, ...) are there for the dataset and
    model configs to interpolate; the loaders do not use them.
    """

    def __init__(
        self,
        dataset: Callable[..., Dataset],
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int | str = 0,
        prefetch_factor: int = 2,
        splits: Sequence[str] = SPLITS,
        collate_fn: str | Callable[[list[Any]], Any] | None = None,
        **interpolated: Any,
    ) -> None:
        if not (num_workers == "auto" or (type(num_workers) is int and num_workers >= 0)):
            raise ConfigError(
                f"data.num_workers={num_workers} is not a number of loader processes; valid: 0, 1, ... or auto"
            )
        if not (type(prefetch_factor) is int and prefetch_factor >= 1):
            raise ConfigError(
                f"data.prefetch_factor={prefetch_factor} must be 1 or more (batches each worker prepares ahead)"
            )
        self.dataset = dataset
        self.batch_size = batch_size  # GLOBAL: samples per optimizer step over all data-parallel replicas
        self.shuffle, self.seed = shuffle, seed
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor
        self.split_names = tuple(splits)
        if isinstance(collate_fn, str):  # module.name, as the config gives it
            collate_fn = located("data.collate_fn", collate_fn, "a function as module.name")
        if not (collate_fn is None or callable(collate_fn)):
            raise ConfigError(f"data.collate_fn={collate_fn!r} is not a function: give one as module.name")
        self.collate_fn = collate_fn
        self.splits: dict[str, Dataset] = {}
        self._first_items: dict[str, Any] = {}

    def setup(self) -> None:
        """Construct each split's dataset (once; every process constructs its own)."""
        for split in self.split_names:
            if split not in self.splits:
                self.splits[split] = self._construct(split)

    def _construct(self, split: str) -> Dataset:
        name = getattr(self.dataset, "func", self.dataset)  # the class behind a partial
        name = getattr(name, "__qualname__", repr(name))
        try:
            dataset = self.dataset(split=split)
        except TypeError as err:  # e.g. a class without a `split` argument, or a key it does not take
            raise ConfigError(
                f"data.dataset {name}(split={split!r}, ...): {err} (a class of your own: data=custom, see its yaml)"
            ) from err
        except OSError as err:  # its files: a wrong folder, a split the data does not have
            untested = "; data.splits=[train,val] if your data has no test split" if split == "test" else ""
            raise ConfigError(
                f"data.dataset {name}(split={split!r}, ...): {type(err).__name__}: {err}{untested}"
            ) from err
        if _foreign_stream(dataset):
            raise ConfigError(
                f"data.dataset {name} is an IterableDataset, which the training reads only through data=streaming "
                "(litdata, resumable mid-epoch): give a map-style Dataset (with __len__ and __getitem__)"
            )
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ConfigError(f"data.dataset {name} must be a map-style Dataset (with __len__ and __getitem__)")
        try:
            len(dataset)
        except TypeError as err:  # (a float from __len__: a traceback in the training's first step)
            raise ConfigError(
                f"data.dataset {name}(split={split!r}): len() fails ({err}): __len__ must return the number of "
                "samples, a whole number"
            ) from None
        return dataset

    def first_item(self, split: str) -> Any:
        """The split's first item, read once: each check before training looks at it."""
        if split not in self._first_items:
            self._first_items[split] = self.splits[split][0]
        return self._first_items[split]

    def source(self, split: str) -> str:
        """How a refusal names the split's data: its file (data=files), or the dataset's class and split."""
        dataset = self.splits[split]
        return str(getattr(dataset, "path", f"data.dataset {type(dataset).__name__}(split={split!r})"))

    @property
    def streams(self) -> bool:
        """Whether the training split is streamed (data=streaming): an IterableDataset class."""
        cls = getattr(self.dataset, "func", self.dataset)
        return isinstance(cls, type) and issubclass(cls, IterableDataset)

    def check_replicas(self, replicas: int, processes: int) -> None:
        """Refuse, before training, a layout this data cannot feed: a stream is dealt out to the processes, each
        its own part, so processes that must read the same batches (tensor-parallel or pipeline ranks) cannot
        share one; and a training split smaller than one global batch (whole batches only: no step would train)."""
        if "train" in self.split_names:
            self.setup()
            train = self.splits["train"]
            # (a stream's length asks litdata to lay it out for this process: its index's count instead)
            samples = train.indexed_samples if self.streams else len(train)
            if samples is not None and samples < self.batch_size:
                smaller = f"data.batch_size={samples} or less, or " if samples else ""  # (none: "=0 or less")
                raise ConfigError(
                    f"the training split has {samples} samples, fewer than one global batch (data.batch_size="
                    f"{self.batch_size}): no step would train; give {smaller}more data"
                )
        if self.streams and replicas != processes:
            raise ConfigError(
                f"data=streaming gives each process its own part of the stream, but these {processes} processes are "
                f"{replicas} data-parallel replica(s) sharing batches (tensor-parallel or pipeline ranks); use "
                "data=files, or strategy=ddp (model_parallel with strategy.tensor_parallel_size=1)"
            )

    def workers(self, processes_per_node: int) -> int:
        """num_workers, with `auto` = min(4, CPU cores per training process on this node): enough to keep
        reading and collating ahead of the step, without the processes of one node fighting for cores."""
        if self.num_workers != "auto":
            return int(self.num_workers)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return min(4, cores // max(1, processes_per_node))

    def loader(
        self,
        split: str,
        replicas: int = 1,
        rank: int = 0,
        pin_memory: bool = False,
        processes_per_node: int = 1,
        accumulate: int = 1,
        limit: int | float | None = None,
    ) -> DataLoader:
        """This data-parallel replica's loader of `split`: `rank`'s share of each global batch, in `accumulate`
        micro-batches (trainer.accumulate_grad_batches); the training split's epochs end after `limit` batches
        (trainer.limit_train_batches, for a loop that does not apply it itself).

        The same seeded sampler for every layout, one replica included: each global batch is then the same
        samples whatever the strategy or engine, shuffled or not. The training split drops its last partial
        batch, so every optimizer step sees a full global batch, as on a single device, and its loader can
        say where it is in the epoch and start there again (see ResumableLoader).
        """
        self.setup()
        train = split == "train"
        dataset = self.splits[split]
        workers = self.workers(processes_per_node)
        if train and isinstance(dataset, IterableDataset):  # data=streaming
            from .streaming import StreamingLoader

            return StreamingLoader(
                dataset,
                replicas,
                rank,
                accumulate=accumulate,
                limit=limit,
                batch_size=per_device_batch_size(self.batch_size, replicas, accumulate),
                num_workers=workers,
                prefetch_factor=self.prefetch_factor if workers else None,
                pin_memory=pin_memory,
                collate_fn=self.collate_fn,
                worker_init_fn=leave_ctrl_c_to_the_training,
            )
        if isinstance(dataset, IterableDataset):  # data=streaming's validation or test split
            dataset = dataset.by_index()
        batch_size = per_device_batch_size(self.batch_size, replicas, accumulate)
        if train:
            sampler = ResumableSampler(
                dataset, num_replicas=replicas, rank=rank, shuffle=self.shuffle, seed=self.seed, drop_last=True
            )
            dataset = SeededSamples(dataset, self.seed)  # the sampler hands it (epoch, index)
        else:
            sampler = EvalSampler(dataset, replicas, rank, batch_size)
            dataset = SeededSamples(WithPadding(dataset) if sampler.padded else dataset, self.seed)
        extra = {"accumulate": accumulate, "limit": limit} if train else {}
        return (ResumableLoader if train else DataLoader)(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=train,
            num_workers=workers,
            persistent_workers=workers > 0,  # not restarted every epoch (and every validation)
            prefetch_factor=self.prefetch_factor if workers else None,  # batches each worker prepares ahead
            pin_memory=pin_memory,  # page-locked host memory makes host-to-GPU copies faster
            collate_fn=self.collate_fn,  # None: torch's default, which stacks samples of one shape
            worker_init_fn=leave_ctrl_c_to_the_training,
            # Each pass draws its workers' base seed: from a generator of its own, not the global one, whose state a
            # resumed training restores (its dropout then draws what the uninterrupted training drew).
            generator=torch.Generator().manual_seed(self.seed),
            **extra,
        )


def _foreign_stream(dataset: object) -> bool:
    """An IterableDataset that is not data=streaming's: the training reads only litdata's streams (it resumes them
    mid-epoch and deals them out to the processes); another one failed inside litdata with a traceback."""
    if not isinstance(dataset, IterableDataset):
        return False
    try:
        from .streaming import StreamedSplit
    except ImportError:  # litdata (data=streaming's extra) not installed: no stream of its
        return True
    return not isinstance(dataset, StreamedSplit)
