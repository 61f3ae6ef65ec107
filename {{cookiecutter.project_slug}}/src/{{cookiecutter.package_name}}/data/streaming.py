"""Data bigger than memory or one machine's disk: `data=streaming data.dir=DIR`, DIR a local folder or a bucket
(s3://, gs://, ...), holding one folder of litdata chunks per split. Write it from the data=files layout with

    python -m {{ cookiecutter.package_name }}.data.streaming FILES_DIR OUT_DIR [--chunk-bytes 64MB] [--workers N]

Built on litdata (Lightning AI's streaming datasets), not WebDataset or a loader of our own: each process reads
whole chunks straight from the bucket into a local cache of bounded size, the chunks are dealt out to the
data-parallel replicas and their loader workers, the order is shuffled per epoch from the seed (chunks, then
samples within a window), and its loader can say where it is in the stream (state_dict), so a checkpoint resumes
mid-epoch with the next batch. WebDataset has no such position: a resumed run replays and skips samples, unless
every seed is fixed and it reads the epoch again up to the checkpoint. litdata also keeps the replicas' batch
counts equal, where WebDataset's split by node deals whole shards (the template repository's benchmarks/RESULTS.md
measures both, and their speed).

What streaming changes: each replica reads its own chunks, so the samples of a global batch depend on the number
of replicas (the loss-parity guarantee of data.loading.Data does not hold across layouts), and a resumed run needs the
same number of processes and loader workers to continue exactly. Validation and test are read in order, each
sample once over the replicas, so their metrics stay exact.
"""

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from litdata import StreamingDataLoader, StreamingDataset, optimize
from litdata.utilities.env import _DistributedEnv
from torch.utils.data import Dataset

from ..errors import ConfigError
from .batch_sizes import batches_per_epoch
from .files import as_trained, describe, read_split, split_file
from .streaming_shapes import SHAPES_FILE

logging.getLogger("litdata").setLevel(logging.WARNING)  # its per-process, per-split notes (cache sizes, mmap) at INFO
# Lightning warns that an IterableDataset's length may be wrong with loader workers: litdata gives each its own
# chunks and counts them in the length.
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")


class StreamedSplit(StreamingDataset):
    """One split of DIR (`DIR/<split>/`, litdata chunks), streamed. `flatten` makes each sample one vector (what
    the classifier's MLP takes); `max_cache_size` bounds the local copy of the chunks (litdata's default: most of
    the free disk)."""

    def __init__(
        self,
        split: str,
        dir: str,
        shuffle: bool = True,
        seed: int = 0,
        flatten: bool = True,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
    ) -> None:
        self.indexed_samples = indexed_samples(f"{dir.rstrip('/')}/{split}")
        super().__init__(
            f"{dir.rstrip('/')}/{split}",
            cache_dir=cache_dir,
            shuffle=shuffle and split == "train",  # validation and test in order
            seed=seed,
            max_cache_size=max_cache_size,
            transform=flat if flatten else None,
        )
        if split != "train":  # the whole split, read by index (by_index)
            self.distributed_env = _DistributedEnv(world_size=1, global_rank=0, num_nodes=1)

    def by_index(self) -> Dataset:
        """A map-style view, for validation and test: each sample once over the replicas (data.EvalSampler), in
        order, so that their metrics are exact (a stream would drop some to keep the replicas even)."""
        return ByIndex(self)


def indexed_samples(split_dir: str) -> int | None:
    """The samples of a local split folder, counted from its litdata index.json without reading a chunk (what
    the check of a split smaller than one global batch needs, before the loader lays the stream out); None for a
    bucket, whose index litdata downloads itself. A folder without one is refused here: litdata's own error is a
    traceback that names its internals."""
    if "://" in split_dir:
        return None
    index = Path(split_dir).expanduser() / "index.json"
    if not index.is_file():
        convert = "python -m {{ cookiecutter.package_name }}.data.streaming FILES_DIR DIR"
        raise ConfigError(
            f"{index.parent}: no index.json, so not a split written by {convert} (data.dir=DIR holds one such "
            "folder per split of data.splits)"
        )
    return sum(chunk["chunk_size"] for chunk in json.loads(index.read_text())["chunks"])


class ByIndex(Dataset):
    def __init__(self, stream: StreamedSplit) -> None:
        self.stream = stream

    def __len__(self) -> int:
        return len(self.stream)

    def __getitem__(self, index: int) -> Any:
        return self.stream[index]


def flat(sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = sample
    return x.reshape(-1), y


class StreamingLoader(StreamingDataLoader):
    """litdata's loader of one data-parallel replica's share of the training stream, with what the engines ask of
    a training loader (data.sampling.ResumableLoader has the same): whole optimizer steps per epoch, `batches_done`,
    `global_batch_size`, and a state that starts a fresh epoch from {"epoch", "samples_done": 0} or continues
    from a saved one, which holds litdata's own position under "stream"."""

    def __init__(
        self,
        dataset: StreamedSplit,
        replicas: int,
        rank: int,
        accumulate: int = 1,
        limit: int | float | None = None,
        **kwargs: Any,
    ) -> None:
        # litdata deals the chunks out to every process of the job; here they go to the data-parallel replicas.
        # Always as one node: litdata 0.2.76, told that the replicas span nodes, dealt a shuffled epoch unevenly
        # (measured: one replica a batch more than the other, some samples twice; a DDP run would hang).
        dataset.distributed_env = _DistributedEnv(world_size=replicas, global_rank=rank, num_nodes=1)
        super().__init__(dataset, drop_last=True, **kwargs)
        self.replicas, self.accumulate, self.limit = replicas, accumulate, limit  # (limit: trainer.limit_train_batches)
        self.batches_done = 0  # of the current epoch, handed out to the training loop
        self._loaded: int | None = None  # batches of the epoch that a loaded state had done

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.replicas

    def __len__(self) -> int:
        return batches_per_epoch(super().__len__() // self.accumulate * self.accumulate, self.limit)

    def __iter__(self) -> Any:
        if self._loaded is None:  # litdata replays a loaded state until an epoch is read to its very end; the
            self.restore = False  # engines stop at len(), so the epoch after a resumed one would replay it
        self.batches_done, self._loaded = self._loaded or 0, None
        for batch in super().__iter__():
            if self.batches_done == len(self):
                break
            self.batches_done += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        # litdata counts epochs from 1 (it adds one as each epoch starts); the engines from 0.
        epoch = self.current_epoch - 1
        samples_done = self.batches_done * self.global_batch_size
        # (the layout litdata's position is for: data.sampling.check_position refuses another one mid-epoch)
        layout = {"replicas": self.replicas, "workers": self.num_workers}
        return {"epoch": epoch, "samples_done": samples_done, "stream": super().state_dict(), **layout}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "stream" in state:
            # litdata's position names the folder it was read from and refuses any other (a traceback at the first
            # batch), but the data may move between starts (runtime/resuming.MAY_MOVE): this run's folder instead.
            here = {"input_dir_path": self.dataset.input_dir.path, "input_dir_url": self.dataset.input_dir.url}
            super().load_state_dict({**state["stream"], "dataset": {**state["stream"]["dataset"], **here}})
            self._loaded = state["samples_done"] // self.global_batch_size
        elif state["samples_done"]:
            raise ValueError("a streamed epoch can only be resumed from the loader's own state (its 'stream' key)")
        else:  # a fresh epoch: its shuffle comes from the seed and the epoch
            self.current_epoch = state["epoch"]


def convert(files_dir: str, out_dir: str, chunk_bytes: str = "64MB", workers: int = 1) -> dict:
    """Write each split of a data=files folder as litdata chunks under OUT_DIR/<split>/ (samples as they are in the
    files, unflattened), and OUT_DIR/shapes.json. Returns what shapes.json holds."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: not empty; give a new folder")
    info = describe(files_dir)  # every split checked, as data=files does
    for split in info["splits"]:
        x, y = read_split(split_file(files_dir, split))
        optimize(
            fn=Sample(x, y),
            inputs=list(range(len(x))),
            output_dir=str(out / split),
            chunk_bytes=chunk_bytes,
            num_workers=workers,
            # Forked on Linux: the workers share the arrays read above. litdata's default, spawn, pickles them to
            # each worker, which imports torch again (~3 s a split on a small folder; the memory twice on a large).
            start_method="fork" if sys.platform == "linux" else None,
            verbose=False,
        )
    (out / SHAPES_FILE).write_text(json.dumps(info, indent=1))
    return info


class Sample:
    """Sample i of (x, y): what litdata.optimize writes for each input index (picklable for its workers)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __call__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return as_trained(self.x[index].clone(), self.y[index].clone())  # clone: a view serialises the whole array


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }}.data.streaming",
        description="Write a data=files folder (train, val[, test]: .npz or .pt) as chunks for data=streaming.",
    )
    parser.add_argument("files_dir", help="the data=files folder")
    parser.add_argument("out_dir", help="a new folder (copy it to a bucket afterwards if you like)")
    parser.add_argument("--chunk-bytes", default="64MB", help="size of each chunk (default 64MB)")
    parser.add_argument("--workers", type=int, default=1, help="processes writing chunks (default 1)")
    args = parser.parse_args(argv)
    try:
        info = convert(args.files_dir, args.out_dir, args.chunk_bytes, args.workers)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {', '.join(info['splits'])} to {args.out_dir}: train with data=streaming data.dir={args.out_dir}")


if __name__ == "__main__":
    main()
