"""data=streaming: a data=files folder converted by `python -m <package>.streaming` into litdata chunks, streamed
by each data-parallel replica; a training stopped mid-epoch continues with the next batch of the stream."""

import contextlib
import functools
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PACKAGE, refuse_all
from engine_specific import QUIET, STREAMING_REFUSALS
from layouts import command, layout
from torch.utils.data import TensorDataset

from {{ cookiecutter.package_name }}.data.loading import Data
from {{ cookiecutter.package_name }}.data.sampling import check_position
from {{ cookiecutter.package_name }}.errors import ConfigError

pytest.importorskip("litdata", reason="data=streaming needs litdata (docs/your-data.md)")
from {{ cookiecutter.package_name }}.data.streaming import StreamedSplit  # noqa: E402
from {{ cookiecutter.package_name }}.data.streaming import main as convert_command  # noqa: E402

TRAIN_SIZE, BATCH = 320, 32  # 10 steps per epoch


@pytest.fixture(scope="module")
def streamed(tmp_path_factory, train_env) -> Path:
    """A files folder (image-like samples, 3 x 4) converted with the real command, in small chunks."""
    files, out = tmp_path_factory.mktemp("files"), tmp_path_factory.mktemp("streamed") / "data"
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(12, 5))
    for split, size in (("train", TRAIN_SIZE), ("val", 70), ("test", 40)):
        x = rng.normal(size=(size, 3, 4)).astype(np.float32)
        np.savez(files / f"{split}.npz", x=x, y=(x.reshape(size, -1) @ teacher).argmax(axis=1))
    command = [sys.executable, "-m", f"{PACKAGE}.data.streaming", str(files), str(out), "--chunk-bytes", "2KB"]
    done = subprocess.run(command, env=train_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    shapes = json.loads((out / "shapes.json").read_text())
    assert shapes == {"num_features": 12, "sample_shape": [3, 4], "num_classes": 5, "splits": ["train", "val", "test"]}
    assert len(list((out / "train").glob("chunk-*.bin"))) > 4, "several chunks to deal out"

    said = io.StringIO()  # the refusal of a second conversion, by the command's main in this process (CI time)
    with contextlib.redirect_stderr(said), pytest.raises(SystemExit) as stopped:
        convert_command(command[3:])
    assert stopped.value.code == 2 and said.getvalue().strip() == f"error: {out}: not empty; give a new folder"
    return out


def stream_data(folder: Path, **settings) -> Data:
    split = functools.partial(StreamedSplit, dir=str(folder), seed=3)  # as the config builds it
    return Data(split, **{"batch_size": BATCH, "splits": ["train", "val"], **settings})


def test_replicas_stream_disjoint_parts_and_resume_from_a_saved_position(streamed):
    loaders = [stream_data(streamed).loader("train", replicas=2, rank=rank) for rank in range(2)]
    seen = [[x for x, _ in loader] for loader in loaders]
    assert [len(batches) for batches in seen] == [len(loader) for loader in loaders] == [10, 10]
    rows = [tuple(row.tolist()) for batches in seen for batch in batches for row in batch]
    assert len(rows) == len(set(rows)) == TRAIN_SIZE, "every sample once over the two replicas"
    assert all(batch.shape == (BATCH // 2, 12) for batches in seen for batch in batches), "flattened, per replica"

    loader = stream_data(streamed).loader("train")
    epoch = [x for x, _ in loader]
    again = [x for x, _ in loader]
    assert not torch.equal(torch.cat(epoch), torch.cat(again)), "reshuffled each epoch"
    loader = stream_data(streamed).loader("train")
    for step, _ in enumerate(loader):
        if step == 3:
            state = loader.state_dict()  # after 4 batches of the first epoch
            break
    assert (state["epoch"], state["samples_done"]) == (0, 4 * BATCH)
    # litdata's position is for its layout: 1 -> 2 processes ended in its traceback from a loader worker, 2 -> 1
    # read other samples in silence; refused before the training (both engines call check_position)
    check_position(state, BATCH, replicas=1, workers=0)
    for replicas, workers in ((2, 0), (1, 2)):
        with pytest.raises(ConfigError, match="stopped inside a streamed epoch read by 1 data-parallel process"):
            check_position(state, BATCH, replicas=replicas, workers=workers)
    check_position(state, BATCH, replicas=1, workers="auto")  # (auto: the node's count, not compared)
    resumed = stream_data(streamed).loader("train")
    resumed.load_state_dict(state)
    rest = [x for x, _ in resumed]
    assert len(rest) == 6 and resumed.batches_done == 10
    assert all(torch.equal(a, b) for a, b in zip(rest, epoch[4:], strict=True)), "the next batches, exactly"


def test_validation_reads_every_sample_once_over_the_replicas(streamed):
    singles = [x for x, _ in stream_data(streamed).loader("val")]
    split = [[x for x, _ in stream_data(streamed).loader("val", replicas=2, rank=rank)] for rank in range(2)]
    rows = lambda batches: sorted(tuple(row.tolist()) for batch in batches for row in batch)  # noqa: E731
    assert rows(split[0] + split[1]) == rows(singles) and len(rows(singles)) == 70


TRAIN = [
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    *QUIET,
    "trainer.accelerator=cpu",
    "test_after_fit=false",
    "data=streaming",
    f"data.batch_size={BATCH}",
    "data.num_workers=1",  # litdata's position includes each worker's
    "scheduler=constant",  # the same learning rates whether or not the training is stopped on the way
    "checkpoint.every_n_steps=3",
]


@pytest.mark.slow
def test_a_stopped_streamed_training_continues_exactly(streamed, train, tmp_path):
    """Two replicas, each with a loader worker: litdata's position is per replica and per worker. The data is
    moved to another folder before the run continues (litdata's position names the folder).

    Each training in a new interpreter, as a user's is, not forked from the tests' helper process (tests/forked.py):
    in three of about twelve CI runs under load a training of this test hung until its 300 s limit (it never hung
    alone, nor in 4 runs beside a CPU load here). The cause is not found (litdata has open reports of DDP hangs at
    an epoch's end); this removes the one way these trainings differ from a user's.
    """
    ddp, launcher = command(layout("ddp"))
    fresh = {"STARTS_NEW_INTERPRETER": "1"}
    train = functools.partial(train, *TRAIN, *ddp, launcher=launcher, env=fresh)
    uninterrupted = train(f"data.dir={streamed}")
    wandb = uninterrupted.wandb
    assert wandb.steps("train/loss") == list(range(20)) and len(wandb.metric("val/loss")) == 2
    assert wandb.config["model"]["net"]["in_features"] == 12, "the model sized from the streamed folder"

    before, after = tmp_path / "data", tmp_path / "moved"  # the data moved between the starts (MAY_MOVE)
    shutil.copytree(streamed, before)
    stopped = train(f"data.dir={before}", "trainer.max_steps=6")  # mid-epoch, after a checkpoint
    before.rename(after)
    resumed = train(f"data.dir={after}", run_dir=stopped.run_dir)
    assert "resuming from" in resumed.output
    history = resumed.wandb
    assert history.steps("train/loss") == list(range(20)), "each step once, none missing"
    assert history.metric("train/loss") == wandb.metric("train/loss")
    validated = dict(zip(history.steps("val/loss"), history.metric("val/loss"), strict=True))
    assert list(validated) == sorted({5, *wandb.steps("val/loss")}), "each epoch's end, and where max_steps stopped"
    assert [validated[step] for step in wandb.steps("val/loss")] == wandb.metric("val/loss")


def test_presets_whose_processes_share_batches_refuse_a_stream(streamed):
    data = stream_data(streamed)
    data.check_replicas(replicas=4, processes=4)  # ddp, or model_parallel as FSDP only
    with pytest.raises(ConfigError, match="data=streaming gives each process its own part of the stream"):
        data.check_replicas(replicas=2, processes=4)  # dp2 x tp2
    pairs = lambda split: TensorDataset(torch.zeros(4, 2), torch.zeros(4))  # noqa: E731
    Data(pairs, batch_size=4).check_replicas(replicas=1, processes=2)  # a pipeline reads map-style data


BAD_INPUT = [
    (["data=streaming"], "data.dir is not set: data=streaming data.dir=DIR"),
    (["data=streaming", "data.dir=/nonexistent"], "/nonexistent/shapes.json: not found"),
    (
        ["data=streaming", "data.dir=s3://bucket/data"],
        "is not read from s3://bucket/data: give data.num_features, data.num_classes and data.splits",
    ),
    (
        ["data=streaming", "data.dir=SHAPES", f"data.batch_size={TRAIN_SIZE + 1}"],
        f"the training split has {TRAIN_SIZE} samples, fewer than one global batch (data.batch_size={TRAIN_SIZE + 1})",
    ),
    (["data=streaming", "data.dir=UNINDEXED"], "/train: no index.json, so not a split written by python -m"),
    *STREAMING_REFUSALS,
]


def test_what_streaming_refuses(streamed, tmp_path_factory, train_env):
    unindexed = tmp_path_factory.mktemp("unindexed") / "data"  # a split's index.json lost in a copy
    shutil.copytree(streamed, unindexed)
    (unindexed / "train" / "index.json").unlink()
    placed = lambda arg: arg.replace("SHAPES", str(streamed)).replace("UNINDEXED", str(unindexed))  # noqa: E731
    cases = [[placed(arg) for arg in case] for case, _ in BAD_INPUT]
    runs = refuse_all(tmp_path_factory.mktemp("refused"), train_env, cases)
    for run, (_, message) in zip(runs, BAD_INPUT, strict=True):
        run.assert_rejected(message)
