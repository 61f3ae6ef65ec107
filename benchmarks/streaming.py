"""litdata against WebDataset, for the template's data=streaming preset: speed, resume, data-parallel split.

    OMP_NUM_THREADS=1 python benchmarks/streaming.py   # defaults: 20000 samples of 784 float32, 8 MB shards
    python benchmarks/streaming.py --samples 50000 --shard-mb 16 --repeats 5 --workers 0 2 4

Standalone: it imports nothing from the template and needs `litdata` and `webdataset` (pip install webdataset).
It generates a classification set in memory (Gaussian class centres, int64 labels, each sample carrying its
index) and writes it three times, shards of about --shard-mb each, reporting the time and the bytes on disk:
litdata chunks (litdata.optimize, as the template's conversion command does); WebDataset tar shards as
webdataset.ShardWriter's documentation writes them (x as .npy, the label as .cls, the index in the key); and
"webdataset tuned": x pickled (.pyd) and an integer mtime, which spares one extra header per file (see
write_webdataset). Then, all reading local files that the page cache holds (it measures the loaders' CPU cost,
not a disk's or a bucket's):

1. Speed. One shuffled epoch per loader (litdata shuffle=True; WebDataset shard shuffle and a shuffle buffer,
   batches made in the workers), the same batch size, each --workers count, --repeats times, the loaders
   interleaved so that the machine's noise hits all alike. First batch: seconds from building the data set and
   loader to the first batch. Samples/s: the rest of the epoch, after the first batch. Medians.
2. Resume (litdata and the tuned WebDataset shards). An uninterrupted epoch gives the reference order of the
   sample indices. A run reads k batches and stops; a fresh loader continues. litdata: state_dict() after k
   batches, load_state_dict() in the fresh loader. WebDataset has no loader state: the fresh loader, built
   with the same seeds, reads the k batches again and drops them; with its default seeds (drawn at random)
   no order can be repeated, and the table counts the samples the two runs read twice or missed. "exact": the
   first run's k batches and then the continued run's batches are the reference order. It also says whether
   the same loader's second epoch comes in another order than its first.
3. Two data-parallel replicas, simulated in one process: litdata through the data set's distributed_env (what
   the template's StreamingLoader sets), WebDataset through nodesplitter=split_by_node with RANK and WORLD_SIZE
   in the environment. Whole batches only (litdata drop_last=True, WebDataset partial=False), as a DDP run
   needs. It counts the samples read once, twice and never over both replicas, and each replica's batches:
   replicas with unequal counts hang DDP at the longer one's next collective.
"""

import argparse
import logging
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

try:
    import webdataset as wds
except ImportError:
    print("pip install webdataset")
    sys.exit(2)

from litdata import StreamingDataLoader, StreamingDataset, optimize
from litdata.utilities.env import _DistributedEnv

logging.getLogger("litdata").setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message=".*IterableDataset.*")


# ---------------------------------------------------------------- data


def make_data(samples: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, samples, dtype=np.int64)
    centres = rng.standard_normal((classes, features), dtype=np.float32)
    x = centres[y] + rng.standard_normal((samples, features), dtype=np.float32)
    return x, y


class Sample:
    """litdata.optimize's function: input index -> sample (module level: optimize pickles it for its workers)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __call__(self, index: int) -> dict:
        return {"x": self.x[index].copy(), "y": int(self.y[index]), "index": index}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_litdata(x: np.ndarray, y: np.ndarray, out: Path, shard_mb: int) -> float:
    start = time.perf_counter()
    optimize(
        fn=Sample(x, y),
        inputs=list(range(len(x))),
        output_dir=str(out),
        chunk_bytes=f"{shard_mb}MB",
        num_workers=1,
        verbose=False,
    )
    seconds = time.perf_counter() - start
    # optimize sets the whole process's multiprocessing start method to spawn (force=True); the loaders below
    # run with Linux's default, fork, as a training process would.
    multiprocessing.set_start_method("fork", force=True)
    return seconds


def write_webdataset(x: np.ndarray, y: np.ndarray, out: Path, shard_mb: int, tuned: bool) -> tuple[float, list[str]]:
    """ShardWriter as its documentation shows it (x as .npy), or `tuned`: x pickled (.pyd, faster to decode than
    .npy's text header) and an integer mtime. The writer's default mtime, time.time(), is a float, which Python's
    tarfile can only store in an extra PAX header per member (TarWriter's `format` argument is not passed on to
    tarfile), so every file of the shard gets two headers; an integer mtime leaves plain ones."""
    out.mkdir(parents=True)
    field, options = ("x.pyd", {"mtime": 0}) if tuned else ("x.npy", {})
    start = time.perf_counter()
    pattern = str(out / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=10**9, maxsize=shard_mb * 1e6, verbose=0, **options) as sink:
        for i in range(len(x)):
            sink.write({"__key__": f"{i:09d}", field: x[i], "y.cls": int(y[i])})
    seconds = time.perf_counter() - start
    return seconds, sorted(str(p) for p in out.glob("shard-*.tar"))


# ---------------------------------------------------------------- loaders

LITDATA, WDS, WDS_TUNED = "litdata", "webdataset", "webdataset tuned"


def litdata_loader(
    path: Path, batch: int, workers: int, seed: int, rank: int | None = None, drop_last: bool = False
) -> StreamingDataLoader:
    dataset = StreamingDataset(str(path), shuffle=True, seed=seed)
    if rank is not None:  # one of two data-parallel replicas, as the template's StreamingLoader does it
        dataset.distributed_env = _DistributedEnv(world_size=2, global_rank=rank, num_nodes=1)
    return StreamingDataLoader(dataset, batch_size=batch, num_workers=workers, drop_last=drop_last)


def to_sample(sample: tuple) -> dict:
    key, x, y = sample
    return {"x": x, "y": y, "index": int(key)}


def collate(samples: list[dict]) -> dict:
    return {
        "x": np.stack([s["x"] for s in samples]),
        "y": np.array([s["y"] for s in samples]),
        "index": np.array([s["index"] for s in samples]),
    }


def webdataset_loader(
    shards: list[str],
    field: str,
    batch: int,
    workers: int,
    seed: int | None,
    buffer: int,
    split: bool = False,
    partial: bool = True,
) -> "wds.WebLoader":
    """WebDataset's documented pipeline: shard list -> per node -> per worker -> shard shuffle -> samples ->
    shuffle buffer -> decode -> batches made in the workers; the loader only passes batches through."""
    dataset = (
        wds.WebDataset(
            shards,
            shardshuffle=len(shards),
            detshuffle=seed is not None,  # a new shard order each epoch, from the seed and an epoch counter
            seed=seed,
            nodesplitter=wds.split_by_node if split else wds.single_node_only,
        )
        .shuffle(buffer, seed=seed)  # seed None: seeded from the pid and the time
        .decode()
        .to_tuple("__key__", field, "y.cls")
        .map(to_sample)
        .batched(batch, collation_fn=collate, partial=partial)
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=workers)


def make(lib: str, args, paths: dict, workers: int, seed: int | None = 0, **kwargs):
    if lib == LITDATA:
        return litdata_loader(paths[lib], args.batch_size, workers, seed, **kwargs)
    field = "x.pyd" if lib == WDS_TUNED else "x.npy"
    return webdataset_loader(paths[lib], field, args.batch_size, workers, seed, args.buffer, **kwargs)


def epoch(loader, stop: int | None = None, skip: int = 0) -> tuple[list[int], list[int], float]:
    """Reads `loader`, the whole epoch or its first `stop` batches, dropping the first `skip` (read, not kept):
    the sample indices in order, the batch sizes and the perf_counter() time of the first batch kept."""
    indices, sizes, first = [], [], None
    for i, batch in enumerate(loader):
        if i < skip:
            continue
        if first is None:
            first = time.perf_counter()
        index = np.asarray(batch["index"]).tolist()
        indices += index
        sizes.append(len(index))
        if stop is not None and len(sizes) == stop:
            break
    return indices, sizes, first


# ---------------------------------------------------------------- measurements


def measure_speed(lib: str, args, paths: dict, workers: int) -> dict:
    built = time.perf_counter()
    indices, sizes, first = epoch(make(lib, args, paths, workers, args.seed))
    end = time.perf_counter()
    return {"first_s": first - built, "rate": (len(indices) - sizes[0]) / (end - first), "samples": len(indices)}


def measure_resume(lib: str, args, paths: dict, workers: int, seeded: bool) -> dict:
    seed = args.seed if seeded else None
    batches = -(-args.samples // args.batch_size)
    k = max(1, int(batches * args.resume_at))
    reference = second = None
    if seeded:  # without seeds, no run can be repeated: nothing to compare an order with
        loader = make(lib, args, paths, workers, seed)
        reference, _, _ = epoch(loader)
        second, _, _ = epoch(loader)  # the same loader's next epoch

    first_run = make(lib, args, paths, workers, seed)
    head, _, _ = epoch(first_run, stop=k)
    state = first_run.state_dict() if lib == LITDATA else None
    del first_run

    start = time.perf_counter()
    resumed = make(lib, args, paths, workers, seed)
    if lib == LITDATA:
        resumed.load_state_dict(state)
        tail, _, first = epoch(resumed)
    else:  # no position to load: read the first k batches again and drop them
        tail, _, first = epoch(resumed, skip=k)
    counts = Counter(head + tail)
    twice = sum(1 for c in counts.values() if c > 1)
    missing = args.samples - len(counts)
    if reference is not None:
        exact = "yes" if head + tail == reference else "no"
    else:
        exact = "no" if twice or missing else "order unknown"
    return {
        "k": k,
        "batches": batches,
        "exact": exact,
        "twice": twice,
        "missing": missing,
        "first_s": first - start,
        "reshuffled": "-" if second is None else ("yes" if second != reference else "no"),
    }


def measure_replicas(lib: str, args, paths: dict, workers: int) -> dict:
    per_rank = []
    for rank in (0, 1):
        if lib == LITDATA:
            loader = make(lib, args, paths, workers, args.seed, rank=rank, drop_last=True)
            per_rank.append(epoch(loader)[:2])
        else:
            os.environ.update(RANK=str(rank), WORLD_SIZE="2")  # what split_by_node reads without a process group
            try:
                per_rank.append(epoch(make(lib, args, paths, workers, args.seed, split=True, partial=False))[:2])
            finally:
                del os.environ["RANK"], os.environ["WORLD_SIZE"]
    counts = Counter(i for indices, _ in per_rank for i in indices)
    return {
        "once": sum(1 for c in counts.values() if c == 1),
        "twice": sum(1 for c in counts.values() if c > 1),
        "never": args.samples - len(counts),
        "batches": [len(sizes) for _, sizes in per_rank],
    }


def table(header: str, rows: list[list]) -> None:
    print("| " + " | ".join(header.split(",")) + " |")
    print("|" + "---|" * len(header.split(",")))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20000, help="samples in the set (default 20000)")
    parser.add_argument("--features", type=int, default=784, help="float32 features per sample (default 784)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--shard-mb", type=int, default=8, help="litdata chunk and WebDataset shard size, MB (8)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--buffer", type=int, default=2000, help="WebDataset shuffle buffer, samples (default 2000)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="loader worker counts (default 0 2)")
    parser.add_argument("--repeats", type=int, default=3, help="speed repetitions per setting (default 3)")
    parser.add_argument("--resume-at", type=float, default=0.5, help="stop after this part of the epoch (0.5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", help="work folder, kept (default: a temporary one, removed at the end)")
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-streaming-"))
    try:
        x, y = make_data(args.samples, args.features, args.classes, args.seed)
        raw = x.nbytes + y.nbytes
        paths = {LITDATA: work / "litdata"}
        written = {LITDATA: write_litdata(x, y, paths[LITDATA], args.shard_mb)}
        for lib, folder in ((WDS, "webdataset"), (WDS_TUNED, "webdataset-tuned")):
            written[lib], paths[lib] = write_webdataset(x, y, work / folder, args.shard_mb, lib == WDS_TUNED)
        print(
            f"\n{args.samples} samples x {args.features} float32 + int64 label, {raw / 1e6:.1f} MB of arrays; "
            f"batch {args.batch_size}; WebDataset shuffle buffer {args.buffer}; "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}\n"
        )
        rows = []
        for lib, seconds in written.items():
            folder = paths[lib] if lib == LITDATA else Path(paths[lib][0]).parent
            files = len(list(folder.glob("*.bin"))) if lib == LITDATA else len(paths[lib])
            size = dir_bytes(folder)
            rows.append([lib, f"{seconds:.1f}", files, f"{size / 1e6:.1f}", f"{size / raw:.2f}"])
        table("write,seconds,shards,MB on disk,/ raw arrays", rows)

        libs = list(paths)
        speed = {(lib, w): [] for w in args.workers for lib in libs}
        for _ in range(args.repeats):
            for w in args.workers:
                for lib in libs:
                    speed[lib, w].append(measure_speed(lib, args, paths, w))
        print(f"\nSpeed: one shuffled epoch, median of {args.repeats} interleaved repetitions\n")
        rows = []
        for (lib, w), runs in speed.items():
            rate = statistics.median(r["rate"] for r in runs)
            first = statistics.median(r["first_s"] for r in runs)
            rows.append([lib, w, runs[0]["samples"], f"{rate:,.0f}", f"{first:.2f}"])
        table("read,workers,samples/epoch,samples/s after the first batch,first batch s", rows)

        print(f"\nResume after {args.resume_at:.0%} of an epoch (a fresh loader continues)\n")
        rows = []
        for w in args.workers:
            for lib, seeded, how in (
                (LITDATA, True, "load_state_dict"),
                (WDS_TUNED, True, "re-read k batches, seeds fixed"),
                (WDS_TUNED, False, "re-read k batches, default seeds"),
            ):
                r = measure_resume(lib, args, paths, w, seeded)
                rows.append(
                    [lib, w, how, f"{r['k']}/{r['batches']}", r["exact"], r["twice"], r["missing"],
                     f"{r['first_s']:.2f}", r["reshuffled"]]
                )  # fmt: skip
        table(
            "read,workers,how,stopped after batch,exact,samples twice,samples missing,"
            "first batch after resume s,2nd epoch reshuffled",
            rows,
        )

        print("\nTwo data-parallel replicas, whole batches only\n")
        rows = []
        for w in args.workers:
            for lib in (LITDATA, WDS_TUNED):
                r = measure_replicas(lib, args, paths, w)
                b0, b1 = r["batches"]
                rows.append(
                    [lib, w, r["once"], r["twice"], r["never"], f"{b0} / {b1}" + ("" if b0 == b1 else " unequal")]
                )
        table("read,workers,read once,read twice,never read,batches rank 0 / rank 1", rows)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
