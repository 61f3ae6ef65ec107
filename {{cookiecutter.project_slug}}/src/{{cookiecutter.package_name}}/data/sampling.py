"""How each replica walks its split, the same on any layout: a seeded order of the global batches that a
resumed run continues mid-epoch (ResumableSampler, ResumableLoader), each sample's own seed for augmenting in
loader workers (SeededSamples), and evaluation splits seen exactly once over the replicas (EvalSampler)."""

import math
import random
import signal
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from ..errors import ConfigError, said_once
from ..parallel.launcher import is_first_process
from . import IGNORED
from .batch_sizes import batches_per_epoch

EVALUATION = 2**32 - 1  # the "epoch" of every evaluation pass, for each sample's seed (SeededSamples)


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


def check_position(
    position: dict[str, int], global_batch_size: int, replicas: int | None = None, workers: int | str | None = None
) -> None:
    """Refuse to continue a checkpoint whose training loader stopped mid-epoch (`position`: its state, {} at an
    epoch's start) after a number of samples that batches of `global_batch_size` do not end on, or, a stream's
    (data=streaming), with another number of data-parallel `replicas` or loader `workers` (data.num_workers=auto,
    whose count is the node's, is not compared): litdata's position is for its own layout (1 -> 2 processes:
    litdata's traceback from a loader worker; 2 -> 1: other samples, in silence). Every process finds it: the first
    says it."""
    samples, epoch = position.get("samples_done", 0), position.get("epoch", 0)
    if samples % global_batch_size:
        message = (
            f"the checkpoint stopped after {samples} samples of epoch {epoch}, which is not a whole number of global "
            f"batches of {global_batch_size}: continue with a data.batch_size that divides {samples} (the one it was "
            "trained with does)"
        )
        raise said_once(ConfigError(message), is_first_process())
    saved = position.get("replicas"), position.get("workers")
    other = saved[0] != replicas or (isinstance(workers, int) and saved[1] != workers)
    if samples and "stream" in position and replicas is not None and saved[0] is not None and other:
        message = (
            f"the checkpoint stopped inside a streamed epoch read by {saved[0]} data-parallel process(es) with "
            f"data.num_workers={saved[1]}, this run has {replicas} with {workers}: litdata continues a stream's "
            "position on its own layout only; resume with those, or from a checkpoint of an epoch's end"
        )
        raise said_once(ConfigError(message), is_first_process())
