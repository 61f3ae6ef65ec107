"""The one way every engine loads data: a map-style Dataset per split, and each data-parallel replica's loader.

The dataset comes from the config (`data.dataset._target_`, constructed once per split as `Class(split=NAME,
**its keys)`): synthetic.py's generated task by default, files.py's arrays with `data=files`, or any map-style
torch Dataset of yours. Everything below it (the global batch split over replicas, the seeded order, exact
mid-epoch resume, worker processes) is the same for all of them. `data=streaming` (streaming.py) is the one
exception: its training split is a stream that litdata's loader deals out and keeps the position of.
"""

import math
import os
import random
import signal
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, TensorDataset, default_collate

from ..errors import ConfigError, located, said_once
from ..parallel.launcher import is_first_process
from ..runtime.optimization import check_trainable
from . import IGNORED, batches_per_epoch

SPLITS = ("train", "val", "test")
EVALUATION = 2**32 - 1  # the "epoch" of every evaluation pass, for each sample's seed (SeededSamples)


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
        if "train" in self.split_names and not self.streams:
            self.setup()
            if (samples := len(self.splits["train"])) < self.batch_size:
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


def leave_ctrl_c_to_the_training(worker_id: int) -> None:
    """A loader worker's start. Ctrl-C reaches every process of the terminal's group, loader workers too, which would
    end (the loader with them, at its next batch, before the training stopped at a step's end): the training answers
    it (runtime.interrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class EvalSampler(DistributedSampler):
    """Every sample of an evaluation split exactly once over the replicas (rank r: samples r, r + replicas, ...),
    in the same number of batches on every replica.

    DistributedSampler pads the split to a multiple of the replicas with repeated samples, so val/test metrics
    over 2+ replicas would count some samples twice and differ from one device's; here a rank may get one sample
    fewer instead (the metrics weigh each batch by its size). That can leave it one batch short (33 samples over
    2 replicas at 16 a batch: 17 and 16), and a replica that skips a forward the others run leaves them waiting
    in it where the forward is a collective (model_parallel's FSDP2 gathers the weights): such a rank ends with
    one padding sample (index len(dataset), see WithPadding) whose targets no metric counts. A DistributedSampler
    still, so that Lightning keeps it instead of inserting its own."""

    def __init__(self, dataset: Sized, replicas: int, rank: int, batch_size: int = 1) -> None:
        super().__init__(dataset, num_replicas=replicas, rank=rank, shuffle=False)
        self.indices = list(range(rank, len(dataset), replicas))
        batches = math.ceil(math.ceil(len(dataset) / replicas) / batch_size)  # rank 0's, which has the most
        self.padded = math.ceil(len(self.indices) / batch_size) < batches
        if self.padded:
            self.indices.append(len(dataset))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter([(EVALUATION, index) for index in self.indices])  # for SeededSamples: the same every pass

    def __len__(self) -> int:
        return len(self.indices)


class WithPadding(Dataset):
    """An evaluation split that also answers EvalSampler's padding index, len(dataset): its first sample, with every
    target padding (padding_target), so that the forward runs and the metrics count nothing of it."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if index < len(self.dataset):
            return self.dataset[index]
        x, y = self.dataset[0]
        return x, padding_target(torch.as_tensor(y))


def padding_target(y: torch.Tensor) -> torch.Tensor:
    """The targets of a padding sample: IGNORED for classes; NaN for values (regression), where -100 may be real."""
    return torch.full_like(y, math.nan if y.is_floating_point() else IGNORED)


def counted(target: torch.Tensor) -> torch.Tensor:
    """Which targets are real, not padding (see padding_target)."""
    return ~target.isnan() if target.is_floating_point() else target != IGNORED


class ResumableSampler(DistributedSampler):
    """torch's DistributedSampler (same seeded order), able to start partway through its epoch; it hands out
    (epoch, index) pairs, for SeededSamples."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0  # indices of this replica's epoch to leave out: the ones a resumed run already trained on

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = list(super().__iter__())[self.start :]
        self.start = 0  # only the epoch being resumed is cut short
        return iter([(self.epoch, index) for index in indices])


class SeededSamples(Dataset):
    """A split whose every sample draws its random numbers (torch's, numpy's and Python's: a Dataset's
    augmentation) from a seed of its own: a function of (data.seed, epoch, index); every evaluation pass is the
    same "epoch", EVALUATION.

    A loader worker's random stream depends on which worker reads the sample and on what it read before, and no
    checkpoint holds it: a resumed run, or another number of workers or replicas, would augment every sample
    differently. Seeded per sample, the same sample of the same epoch gets the same augmentation wherever and
    whenever it is read. The process's own random state is put back after each sample (without worker
    processes, the samples are read in the training process, whose random numbers are dropout's)."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        plain = dataset.dataset if isinstance(dataset, WithPadding) else dataset
        self.draws = not isinstance(plain, TensorDataset)  # indexing tensors draws no random number: no cost

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int] | int) -> Any:
        if isinstance(key, int):  # a plain index, e.g. the batch-size finder's trial batches
            return self.dataset[key]
        epoch, index = key
        if not self.draws:
            return self.dataset[index]
        sample_seed = int(np.random.SeedSequence([self.seed, epoch, index]).generate_state(1, np.uint64)[0])
        states = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
        # The CPU's generator alone: torch.manual_seed also reseeds CUDA's, which is not put back, and where CUDA is not
        # started queues that with a stack trace (a loader worker's sample took 1.7x as long).
        torch.default_generator.manual_seed(sample_seed)
        np.random.seed(sample_seed % 2**32)
        random.seed(sample_seed)
        try:
            return self.dataset[index]
        finally:
            torch.random.set_rng_state(states[0])
            np.random.set_state(states[1])
            random.setstate(states[2])


class ResumableLoader(DataLoader):
    """A training DataLoader that can be checkpointed mid-epoch: its state is the epoch and the samples of the
    GLOBAL batch order already trained on, so a resumed run continues with the next batch, on any number of
    data-parallel replicas (the global batch, hence the order of global batches, does not depend on it).

    torch's DataLoader has no state_dict; Lightning (>= 2.2) saves and restores that of a loader that has
    one, and accelerate does for objects registered for checkpointing. Batches are counted as they are handed
    out, not as the sampler is read, so worker prefetching does not move the count.
    """

    sampler: ResumableSampler

    def __init__(self, *args: Any, accumulate: int = 1, limit: int | float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accumulate = accumulate  # micro-batches per optimizer step
        self.limit = limit  # trainer.limit_train_batches, where the engine's loop does not apply it itself
        self.batches_done = 0  # of the current epoch, handed out to the training loop
        self._resume: tuple[int, int] | None = None  # (epoch, batches done) to continue from

    @property
    def global_batch_size(self) -> int:
        """Samples per micro-batch over all replicas (per optimizer step when nothing is accumulated)."""
        return self.batch_size * self.sampler.num_replicas

    def __len__(self) -> int:
        # Whole optimizer steps only: the micro-batches left over at the end of an epoch would make a smaller step.
        return batches_per_epoch(super().__len__() // self.accumulate * self.accumulate, self.limit)

    def __iter__(self) -> Iterator[Any]:
        self.batches_done = 0
        if self._resume is not None and self._resume[0] == self.sampler.epoch:
            self.batches_done = self._resume[1]
            self.sampler.start = self.batches_done * self.batch_size
        self._resume = None
        batches = len(self)  # once: it asks the batch sampler, then the sampler, every time
        for batch in super().__iter__():
            if self.batches_done == batches:
                break
            self.batches_done += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "samples_done": self.batches_done * self.global_batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        samples, epoch = state["samples_done"], state["epoch"]
        check_position(state, self.global_batch_size)  # (the engines check it before anything is written too)
        self.sampler.set_epoch(epoch)
        self._resume = (epoch, samples // self.global_batch_size)


def check_position(position: dict[str, int], global_batch_size: int) -> None:
    """Refuse to continue a checkpoint whose training loader stopped mid-epoch (`position`: its state, {} at an
    epoch's start) after a number of samples that batches of `global_batch_size` do not end on. Every process finds
    it: the first says it."""
    samples, epoch = position.get("samples_done", 0), position.get("epoch", 0)
    if samples % global_batch_size:
        message = (
            f"the checkpoint stopped after {samples} samples of epoch {epoch}, which is not a whole number of global "
            f"batches of {global_batch_size}: continue with a data.batch_size that divides {samples} (the one it was "
            "trained with does)"
        )
        raise said_once(ConfigError(message), is_first_process())


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


TOKEN_IDS = (torch.int64, torch.int32)  # what nn.Embedding looks up


def check_input(net: nn.Module, data: Data, mixed_precision: bool = False) -> None:
    """Refuse, before training starts (and before anything is written), data the net cannot read, in one line.
    Every submodule with a `check_input(x)` method (gpt.py's token embedding, the MLP's sample size) sees each
    split's first sample, as a batch of one; a net of yours can do the same. The first layer the forward gives x to
    (first_layer: what a forward that casts its input, x.float() / 255 or x.long(), casts it to) takes floats of
    its weights' type, or, an nn.Embedding, ids as int64 or int32: integers for another layer (images stored as
    uint8), uint8 ids, and floats of another precision (float64, numpy's default; float32 for weights in bf16) failed
    at the first step, unless `mixed_precision` (bf16-mixed, 16-mixed), whose autocast casts floats (not float64).
    NaN or infinite values made every loss NaN. x as a Python list (torch's collate makes it a list of tensors) and
    text targets failed at the first step. A training needs the train and val splits, each with samples."""
    if missing := [split for split in ("train", "val") if split not in data.split_names]:
        raise ConfigError(
            f"data.splits={list(data.split_names)} has no {' and '.join(missing)}: the training needs train and val "
            "(test is optional: data.splits=[train,val])"
        )
    checks = [module.check_input for module in net.modules() if callable(getattr(module, "check_input", None))]
    data.setup()
    for split, dataset in data.splits.items():
        if isinstance(dataset, IterableDataset):  # a stream: its samples come as its reader writes them
            continue
        if len(dataset) == 0:  # (an IndexError reading its first sample)
            optional = ", or leave it out of data.splits" if split not in ("train", "val") else ""
            raise ConfigError(f"{data.source(split)} has no samples: give the split data{optional}")
        sample = data.first_item(split)
        if not (isinstance(sample, tuple | list) and len(sample) == 2):
            raise ConfigError(
                f"data.dataset {type(dataset).__name__}: an item is {type(sample).__name__}, but the training takes "
                "(x, y) pairs: return x, y from __getitem__ (x may be a dict or tuple of tensors)"
            )
        source = data.source(split)
        if isinstance(sample[1], str | bytes):  # (the metrics' count of targets: an AttributeError's traceback)
            raise ConfigError(
                f"{source}: y is text ({sample[1]!r}), but the training takes class ids 0 to classes - 1 (map each "
                "name to its id) or float values"
            )
        inputs = (torch.Tensor, np.ndarray, Mapping)  # (a list of these: several inputs, each collated)
        listed = isinstance(sample[0], list) and not any(isinstance(part, inputs) for part in sample[0])
        if listed and data.collate_fn is None:
            raise ConfigError(
                f"{source}: x is a Python list, which torch's default collate turns into a list of one tensor per "
                "position: return x as a tensor or numpy array (torch.tensor(x)), or give data.collate_fn"
            )
        try:
            x = torch.as_tensor(sample[0])[None]
        except (TypeError, ValueError, RuntimeError):  # not an array (e.g. a dict): the net reads it its own way
            continue
        for check in checks:
            check(x)
        if data.collate_fn is None:  # (a collate of yours may cast: the batch it makes is the net's)
            stored = dataset.tensors[0].dtype if isinstance(dataset, TensorDataset) else x.dtype  # (files: as saved)
            check_input_type(net, x, source, stored, mixed_precision)
        check_finite(source, 0, sample)


class _Reached(Exception):  # noqa: N818 (not an error: first_layer's way out of the forward)
    pass


def first_layer(net: nn.Module, x: torch.Tensor) -> tuple[str, nn.Module, torch.dtype] | None:
    """The first module with weights of its own that the net's forward gives a tensor (its name, itself, and the
    tensor's dtype), found on the meta device: the forward stops there. None where the forward cannot get there on
    the meta device (it reads a value, or adds a buffer of the net's)."""
    reached: list[tuple[str, nn.Module, torch.dtype]] = []

    def stop(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            if args and isinstance(args[0], torch.Tensor):
                reached.append((name, module, args[0].dtype))
                raise _Reached

        return hook

    layers = [(name, module) for name, module in net.named_modules() if any(True for _ in module.parameters(False))]
    handles = [module.register_forward_pre_hook(stop(name)) for name, module in layers]
    training = net.training
    try:
        with torch.no_grad():
            net.eval()(x.to("meta"))
    except _Reached:
        pass
    except Exception:  # noqa: BLE001 (what the meta device cannot run: the training tells)
        return None
    finally:
        for handle in handles:
            handle.remove()
        net.train(training)
    return reached[0] if reached else None


def check_input_type(net: nn.Module, x: torch.Tensor, source: str, stored: torch.dtype, mixed_precision: bool) -> None:
    """Refuse x of a type the net's first layer cannot take (check_input); `stored`: x's type as the data has it."""
    reached = first_layer(net, x)
    if reached is None:  # not seen: the net as a whole (a net with an nn.Embedding may read ids of any integer type)
        name, layer, dtype = "", net, x.dtype
        reads_ids = any(isinstance(module, nn.Embedding | nn.EmbeddingBag) for module in net.modules())
        if reads_ids and not dtype.is_floating_point:
            return
    else:
        name, layer, dtype = reached
        reads_ids = isinstance(layer, nn.Embedding | nn.EmbeddingBag)
    weights = next((param.dtype for param in layer.parameters() if param.is_floating_point()), None)
    what = f"model.net's first layer {name} ({type(layer).__name__})" if name else "the model"
    cast = f", which its forward casts to {short(dtype)}" if dtype != x.dtype else ""
    given = f"{source}: x is {short(stored)}{cast},"
    if reads_ids:
        if dtype not in TOKEN_IDS:
            raise ConfigError(
                f"{given} but {what} looks up ids as int64 or int32: return token ids as int64 (x.long()), or images "
                "as float32 for a layer that takes them"
            )
        return
    if not dtype.is_floating_point:
        raise ConfigError(
            f"{given} but {what} takes floating-point samples: store x as float32 (images scaled to [0, 1], e.g. "
            "x.astype(numpy.float32) / 255), or token ids with a model that embeds them (model=gpt, or a net of "
            "yours whose first layer is an nn.Embedding)"
        )
    casts = mixed_precision and torch.float64 not in (dtype, weights)  # autocast's layers take either
    if weights not in (None, dtype) and not casts:  # a dtype error at the first step
        example = "x.float(), x.astype(numpy.float32)" if weights == torch.float32 else f"x.to(torch.{short(weights)})"
        autocast = ", or train with trainer.precision=bf16-mixed, whose autocast casts it" * (weights != torch.float64)
        raise ConfigError(
            f"{given} but {what} has {short(weights)} weights: return x as {short(weights)} from __getitem__ or store "
            f"it so (e.g. {example}){autocast}"
        )


def short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# torch's words, on the meta device, for samples a layer cannot take: Linear, view, add (a matrix product's differ
# from the CPU's "mat1 and mat2 shapes cannot be multiplied"); conv, norms, RNNs, attention
SHAPE_ERRORS = (
    "must have same reduction dim",
    "is invalid for input of size",
    "must match the size of tensor",
    "Invalid channel dimensions",
    "(unbatched) or",
    "running_mean should contain",
    "normalized_shape",
    "must be equal to input_size",
    "was expecting embedding dimension",
)
LABELS_READ = 64  # the training split's first samples the checks read: finite, of one shape, targets in the classes
# a loss's words for an output and targets that do not fit each other (torch's cross-entropy and regression losses,
# the engines' cross-entropy of one value per sample)
LOSS_SHAPE_ERRORS = ("batch_size", "size of tensor", "must match", "same size", "shape", "Dimension out of range")
LOSS_SHAPE_ERRORS += ("not one value per sample",)


def check_output(
    net: nn.Module,
    data: Data,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    micro_batch_size: int | None = None,
    synchronised: bool = False,
) -> None:
    """Refuse, in one line before training, a net the loss (the engine's, or one of yours) cannot train on this data:
    its forward cannot take the samples, it returns something else than one tensor (a dict, a tuple), the loss
    cannot take its output with the data's targets (float targets for cross-entropy, shapes that do not match) or
    would broadcast them (a prediction of shape (B, 1) for targets (B,)), a class target is not one of its classes,
    or the first training samples (LABELS_READ) hold NaN or infinite values or, without data.collate_fn, differ in
    shape (unless each process's micro-batch, `micro_batch_size`, is one sample). `net` is on the meta device: the
    forward and the loss run on shapes alone (no memory, no compute), on the training split's first sample; what the
    meta device cannot run (shapes that depend on values) is left to the training. Also a net with nothing to train
    (a traceback at the first backward), and BatchNorm under micro-batches of one sample (one at the first step),
    unless it is `synchronised` over the processes (their samples together: ddp's one image per GPU)."""
    check_trainable(net)
    data.setup()
    dataset = data.splits.get("train")
    if dataset is None or isinstance(dataset, IterableDataset):
        return
    item = data.first_item("train")
    # the batch the net gets: a collate of yours may change x's layout, or pad
    batch = collated(data.collate_fn, item) if data.collate_fn is not None else None
    name, training, logits = type(net).__name__, net.training, None
    try:
        if batch is None:
            x, y = (torch.as_tensor(part)[None] for part in item)
        else:
            x, y = (torch.as_tensor(part) for part in batch)
    except (TypeError, ValueError, RuntimeError):  # not arrays (e.g. a dict of a tokenizer's): what the net gives
        check_structured_output(net, batch if batch is not None else default_collate([item]), loss)
        return
    try:
        with torch.no_grad():
            logits = net.eval()(x.to("meta"))  # eval: a batch of one through BatchNorm
    except ConfigError:  # a module's own check_input, on the batch a collate of yours made
        raise
    except Exception as error:  # noqa: BLE001 (any other error: the meta device, not the data; the training runs it)
        # (e.g. transformers' forward reads a value: `.item()` on meta. The checks of the data's values still run.)
        if any(words in str(error) for words in SHAPE_ERRORS):
            raise ConfigError(
                f"model.net {name} cannot take the data's samples of shape {tuple(x.shape[1:])}"
                f"{' (from data.collate_fn)' if data.collate_fn else ''} "
                f"({str(error).splitlines()[0]}): give the model the data's sizes (data.num_features, ...)"
            ) from None
    finally:
        net.train(training)
    if logits is not None and micro_batch_size == 1 and not synchronised:
        check_single_sample_training(net, x)
    samples = [dataset[index] for index in range(1, min(len(dataset), LABELS_READ))]
    for index, sample in enumerate(samples, start=1):
        check_finite(data.source("train"), index, sample)
    check_token_ids(net, [item[0], *(sample[0] for sample in samples)])
    first = tuple(x.shape[1:])
    other = next((shape for sample in samples if (shape := tuple(torch.as_tensor(sample[0]).shape)) != first), None)
    if other is not None and data.collate_fn is None and micro_batch_size != 1:  # torch's collate: "stack expects"
        raise ConfigError(
            f"{data.source('train')}: samples of different shapes ({first}, {other}, ...), which torch's default "
            "collate cannot stack into a batch: give data.collate_fn=module.function that pads them"
        )
    if logits is None:  # (the meta device could not run the net)
        return
    if not isinstance(logits, torch.Tensor):
        raise not_logits(name, logits)
    check_loss(loss, logits, y.to("meta"), name)
    if y.is_floating_point():  # values (regression): no classes to count
        return
    binary = logits.dim() == 1 and logits.shape == y.shape  # one logit per sample, for a loss of yours (BCE's)
    if not (binary or rows_per_target(logits, y)):  # one score per sample, say: "gives 1 classes (0 to 0)" before
        raise logits_per_target(name, logits, y)
    labels = [torch.as_tensor(target) for target in [y[0], *(sample[1] for sample in samples)]]
    labels = [label[label != IGNORED] for label in labels]  # (-100: a target cross-entropy leaves out)
    labels = [label for label in labels if label.numel()]
    if not labels:
        return
    if (smallest := min(int(label.min()) for label in labels)) < 0:
        raise ConfigError(
            f"the data has target {smallest} (in its first {len(labels)} training samples): class targets are 0 to "
            f"the number of classes - 1 ({IGNORED}: left out of the loss)"
        )
    largest = max(int(label.max()) for label in labels)
    if binary and largest > 1:
        raise ConfigError(
            f"the data has target {largest} (in its first {len(labels)} training samples), but model.net {name} gives "
            "one logit per sample, a binary classifier's (classes 0 and 1): give it a row of logits per sample, one "
            "per class, for the template's cross-entropy, or, for values (a regression), store y as floats"
        )
    if not binary and largest >= logits.shape[-1]:
        raise ConfigError(
            f"the data has target {largest} (in its first {len(labels)} training samples), but model.net {name} "
            f"gives {logits.shape[-1]} classes (0 to {logits.shape[-1] - 1}): set data.num_classes (or the model's "
            "size) to the largest target + 1"
        )


def check_single_sample_training(net: nn.Module, x: torch.Tensor) -> None:
    """A training forward of a batch of one sample on the meta device: BatchNorm refuses one value per channel."""
    training = net.training
    try:
        with torch.no_grad():
            net.train()(x.to("meta"))
    except ValueError as error:
        if "more than 1 value per channel" not in str(error):
            return
        raise ConfigError(
            f"model.net {type(net).__name__} has BatchNorm, which trains on more than one value per channel, and each "
            "process's micro-batch is one sample here (data.batch_size / processes / trainer.accumulate_grad_batches):"
            " give a larger data.batch_size, or fewer processes or accumulation steps"
        ) from None
    except Exception:  # noqa: BLE001 (what the meta device cannot run: the training runs it)
        return
    finally:
        net.train(training)


def check_structured_output(
    net: nn.Module, batch: Any, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> None:
    """check_output for samples whose x is several tensors (a dict, a tuple): the net's forward on a batch of one, on
    the meta device, must give one tensor the loss takes with the targets (a dict of outputs failed at the first step,
    once the run folder and wandb run were made). What the meta device cannot run is left to the training."""
    try:
        x, y = tree_map(lambda part: part.to("meta") if isinstance(part, torch.Tensor) else part, tuple(batch))
    except (TypeError, ValueError):  # not (x, y): the training says what it needs
        return
    training = net.training
    try:
        with torch.no_grad():
            logits = net.eval()(x)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 (the meta device, or a forward that takes the dict's keys: left to the training)
        return
    finally:
        net.train(training)
    if not isinstance(logits, torch.Tensor):
        raise not_logits(type(net).__name__, logits)
    if isinstance(y, torch.Tensor):
        check_loss(loss, logits, y, type(net).__name__)


def targets_are_values(data: Data) -> bool:
    """Whether the training split's targets are floats (a regression: no accuracy, no perplexity)."""
    data.setup()
    if not isinstance(data.splits.get("train"), Dataset) or isinstance(data.splits["train"], IterableDataset):
        return False
    try:
        return torch.as_tensor(data.first_item("train")[1]).is_floating_point()
    except (TypeError, ValueError, RuntimeError, IndexError):  # targets of a form of yours: the training tells
        return False


def collated(collate_fn: Callable[[list[Any]], Any], item: Any) -> Any:
    """What `collate_fn` makes of one item: refused in one line unless an (x, y) pair, as the training takes it."""
    name = getattr(collate_fn, "__qualname__", type(collate_fn).__name__)
    try:
        batch = collate_fn([item])
    except (TypeError, ValueError, RuntimeError) as err:  # (a traceback after the run folder was made)
        raise ConfigError(
            f"data.collate_fn {name} fails on a list of one sample ({type(err).__name__}: {str(err).splitlines()[0]}): "
            "it takes one argument, the list of (x, y) samples, and returns x, y"
        ) from None
    if isinstance(batch, Mapping) or not (isinstance(batch, tuple | list) and len(batch) == 2):
        what = f"{len(batch)} items" if isinstance(batch, tuple | list) else f"a {type(batch).__name__}"
        raise ConfigError(
            f"data.collate_fn {name} returns {what}, but the training takes (x, y) batches: return x, y (x may be a "
            "dict or tuple of tensors, which your model reads)"
        )
    return batch


def check_token_ids(net: nn.Module, inputs: list[Any]) -> None:
    """Integer samples are ids a net's first nn.Embedding looks up: one past its size was an IndexError in the
    first step (labels are checked against the classes apart)."""
    embedding = next((module for module in net.modules() if isinstance(module, nn.Embedding)), None)
    ids = [torch.as_tensor(x) for x in inputs if isinstance(x, torch.Tensor | list | int)]
    ids = [x for x in ids if x.numel() and not x.is_floating_point() and x.dtype != torch.bool]
    if embedding is None or not ids:
        return
    smallest, largest = min(int(x.min()) for x in ids), max(int(x.max()) for x in ids)
    size = embedding.num_embeddings
    if smallest < 0 or largest >= size:
        raise ConfigError(
            f"the data has token id {smallest if smallest < 0 else largest} (in x of its first {len(ids)} training "
            f"samples), but model.net {type(net).__name__} embeds {size} (0 to {size - 1}): set the vocabulary "
            "(data.num_classes, or model.net.vocab_size) to the largest id + 1"
        )


def check_loss(
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], output: torch.Tensor, y: torch.Tensor, name: str
) -> None:
    """The loss on the net's output for a batch of one (meta tensors): refused in one line if it fails, or if torch
    warns that it broadcasts the two (its regression losses do, for (B, 1) against (B,))."""
    dtype = str(y.dtype).removeprefix("torch.")
    pair = f"output {tuple(output.shape[1:])} per sample, targets {tuple(y.shape[1:])} {dtype}"
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            loss(output, y)
        except Exception as error:  # noqa: BLE001 (the loss's own words, in the one line)
            message = str(error)
            shapes = any(words in message for words in LOSS_SHAPE_ERRORS)
            values_for_classes = y.is_floating_point() and "dtype" in message  # cross-entropy of float targets
            one_value = y.is_floating_point() and output.dim() == 1  # per sample: a regression, not classes
            if "meta" in message.lower() or not (shapes or values_for_classes or one_value):
                return  # what the meta device, or a loss that reads more than its two tensors, cannot run here
            if not y.is_floating_point() and not rows_per_target(output, y):
                raise logits_per_target(name, output, y) from None
            hint = (
                "cross-entropy takes class indices: store y as integers, or, for values (regression), train with a "
                "loss of yours (docs/your-model.md)"
                if values_for_classes
                else "make the model's output and the loss fit the targets (docs/your-model.md)"
            )
            if one_value and not values_for_classes:
                hint = "for values (regression), train with a loss of yours, e.g. MSE (docs/your-model.md)"
            if y.is_floating_point() and y.shape == output.shape and y.dim() > 1:  # torch's words: batch sizes
                message = "targets shaped as the output are one-hot rows or class probabilities, not class indices"
                hint = (
                    "the template's loss (cross-entropy over class indices) takes integer labels: store y as integers "
                    "(y.argmax(-1) of one-hot rows), or train soft labels with a loss of yours (docs/your-model.md)"
                )
            raise ConfigError(
                f"the loss cannot train model.net {name} on this data ({pair}): "
                f"{message.splitlines()[0].rstrip('.')}; {hint}"
            ) from None
    if any("different to the input size" in str(warning.message) for warning in warned):
        raise ConfigError(
            f"the loss would broadcast model.net {name}'s output against the targets ({pair}), comparing every "
            "prediction with every target: give them one shape (e.g. squeeze the output's last dimension)"
        )


def rows_per_target(logits: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether `logits` has one row of class scores per class target of `y` (a batch of one), in the targets' shape:
    labels of shape (B, 1) for logits (B, C) trained alike (the loss flattens both) but broadcast in the accuracy
    (B x B comparisons: above 1 in the Accelerate engine)."""
    return logits.dim() >= 2 and logits.shape[:-1] == y.shape


def logits_per_target(name: str, logits: torch.Tensor, y: torch.Tensor) -> ConfigError:
    hint = " (labels of shape (1,): return each as a number, e.g. y.squeeze(-1))" if y.shape[1:] == (1,) else ""
    if logits.dim() == 1 and logits.shape == y.shape:  # (the template's cross-entropy refuses it)
        hint = "; a binary classifier's one logit per sample trains with a loss of yours (binary cross-entropy)"
    return ConfigError(
        f"model.net {name} gives logits of shape {tuple(logits.shape[1:])} per sample for targets of shape "
        f"{tuple(y.shape[1:])}: the loss takes one row of logits per target ((classes,) for a label, (positions, "
        f"vocabulary) for a sequence){hint}"
    )


def check_finite(source: str, index: int, sample: Any) -> None:
    """Refuse a sample with NaN or infinite values in x: every loss it is in would be NaN, and the weights with it,
    with the run going on to its end. An array only (a dict of yours: its own way). (NaN targets are left to the
    loss: the engines mark padding so, and a loss of yours may leave out missing values.)"""
    try:
        x = torch.as_tensor(sample[0])
    except (TypeError, ValueError, RuntimeError):
        return
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ConfigError(
            f"{source}: sample {index}'s x has NaN or infinite values, which make the loss NaN: clean or drop them "
            "(e.g. numpy.nan_to_num)"
        )


def not_logits(name: str, output: object) -> ConfigError:
    """The refusal of a net whose forward returns `output`, not one tensor of logits (a dict, a tuple)."""
    return ConfigError(
        f"model.net {name} returns a {type(output).__name__}, but the loss takes one tensor of logits, (batch, "
        "classes) or (batch, positions, vocabulary): return the logits from its forward (an auxiliary output: keep "
        "it on the net, self.aux = ..., and add its term in a loss of your own, docs/your-model.md)"
    )


def first_sample(data: Data) -> Any:
    """The training split's first sample, as a batch of one: a tensor, or what the dataset gives when that is not
    an array (a dict of tensors, say); None when the split cannot be read by index (a stream) or is empty. What the
    checks before training, the doctor and the bench run the net on."""
    data.setup()
    try:
        x = data.first_item("train")[0]
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, NotImplementedError):  # (IndexError: empty)
        return None
    try:
        return torch.as_tensor(x)[None]
    except (TypeError, ValueError, RuntimeError):
        return x


def first_input(data: Data) -> Any:
    """The net's input for the training split's first item, a batch of one as the loader makes it (data.collate_fn,
    else torch's default collate); None where first_sample has none."""
    if first_sample(data) is None:
        return None
    item = data.first_item("train")
    return (collated(data.collate_fn, item) if data.collate_fn is not None else default_collate([item]))[0]


# The batch arithmetic, in one place (the data, every strategy, the batch-size finders and the OOM recovery use it):
#   global batch (data.batch_size) = micro-batch x micro-batches accumulated per step x data-parallel replicas


def batch_parts(replicas: int, accumulate: int = 1) -> int:
    """How many micro-batches one global batch is cut into: one per replica and accumulated micro-batch."""
    return replicas * accumulate


def check_limit(name: str, limit: Any) -> None:
    """Refuse, before training, a trainer.limit_*_batches that is not a count or a share (negative, a share above 1,
    not a number): Lightning's own words were a comparison's TypeError."""
    valid = limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0)
    valid = valid or (isinstance(limit, float) and 0.0 <= limit <= 1.0)
    if not valid:
        raise ConfigError(f"trainer.{name}={limit} must be a number of batches (0 or more) or a share from 0.0 to 1.0")


def check_epoch_batches(limit: int | float | None, batches: int, accumulate: int) -> None:
    """The `batches` of an epoch under trainer.limit_train_batches=`limit` train something and end on an optimizer
    step (Lightning would step after the epoch's last micro-batch on a smaller global batch)."""
    if batches == 0:
        raise ConfigError(
            f"trainer.limit_train_batches={limit} leaves no training batch in an epoch: give a number of batches "
            "(1 or more) or a larger share"
        )
    if batches % accumulate:
        raise ConfigError(
            f"trainer.limit_train_batches={limit} makes epochs of {batches} micro-batches, which "
            f"trainer.accumulate_grad_batches={accumulate} does not divide: the last step would be a smaller batch; "
            f"give a multiple of {accumulate}"
        )


def check_evaluation_batches(data: Data, replicas: int, limits: Mapping[str, Any]) -> None:
    """A share of the val or test batches (trainer.limit_val_batches, limit_test_batches: 0.0 to 1.0) that leaves
    none of the batches each process evaluates. Lightning refuses it when it gets there, once a wandb run is
    created (validation) or after the training (test); both engines refuse it before anything starts."""
    for split, limit in limits.items():
        if not isinstance(limit, float) or not 0 < limit < 1 or split not in data.split_names:
            continue
        batches = len(data.loader(split, replicas))
        if int(batches * limit) == 0:
            raise ConfigError(
                f"trainer.limit_{split}_batches={limit} leaves none of the {batches} {split} batches each process "
                f"evaluates: give a share of at least {1 / batches:.3g}, a number of batches (1 or more), or 0 to "
                f"skip {'validation' if split == 'val' else 'the test'}"
            )


def global_batch_size(micro_batch_size: int, replicas: int, accumulate: int = 1) -> int:
    """The global batch (data.batch_size) of micro-batches of `micro_batch_size` samples on each replica."""
    return micro_batch_size * batch_parts(replicas, accumulate)


def per_device_batch_size(global_batch_size: int, replicas: int, accumulate: int = 1) -> int:
    """The micro-batch each replica computes at once: the global batch divided over the data-parallel replicas
    and the micro-batches accumulated per optimizer step (trainer.accumulate_grad_batches); a clear error if it
    does not divide."""
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int | np.integer):
        # (12.0 reached the DataLoader: a traceback after the run folder and the wandb run were made)
        finite = isinstance(global_batch_size, float) and math.isfinite(global_batch_size)
        low = math.floor(global_batch_size) if finite else None
        hint = "" if low is None else f": data.batch_size={low}" if low == global_batch_size else ""
        hint = hint or ("" if low is None else f"; nearest: {low} or {low + 1}")
        if isinstance(global_batch_size, str):  # (a ${oc.env:NAME} of the command line: text)
            hint = "; a value read with ${oc.env:NAME} is text: give ${oc.decode:${oc.env:NAME}}"
        raise ConfigError(
            f"data.batch_size={global_batch_size} must be a whole number of samples (the global batch){hint}"
        )
    if accumulate < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches={accumulate} must be 1 or more (micro-batches per step)")
    parts = batch_parts(replicas, accumulate)
    if accumulate > 1 and (global_batch_size < 1 or global_batch_size % parts):
        raise ConfigError(
            f"data.batch_size={global_batch_size} is the global batch = micro-batch x "
            f"trainer.accumulate_grad_batches={accumulate} x {replicas} data-parallel replicas, so a positive "
            f"multiple of {parts}; nearest valid: {nearest_multiples(global_batch_size, parts)}"
        )
    if global_batch_size < 1 or global_batch_size % replicas:
        raise ConfigError(
            f"data.batch_size={global_batch_size} is the global batch and must be a positive multiple of the "
            f"{replicas} data-parallel replica{'s' if replicas > 1 else ''}; nearest valid: "
            f"{nearest_multiples(global_batch_size, replicas)}"
        )
    return global_batch_size // parts


def nearest_multiples(value: int, factor: int) -> str:
    below = max(factor, value // factor * factor)
    return str(factor) if value < factor else f"{below} or {below + factor}"
