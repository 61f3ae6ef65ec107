"""Bring your own data: data=files (.npz / .pt splits, shapes read from the files) and data=custom (any map-style
Dataset class), in the engine this project was generated with."""

import itertools
import math
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import QUICK
from custom_dataset import NoisyParity, Parity
from torch import nn
from torch.utils.data import TensorDataset

from {{ cookiecutter.package_name }}.data.checks import check_input, check_output
from {{ cookiecutter.package_name }}.data.files import FilesDataset, describe, resolve
from {{ cookiecutter.package_name }}.data.loading import Data
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.gpt import GPT
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.runtime.metrics import correct_predictions, cross_entropy, summed_loss  # the engines' loss

SHAPE, CLASSES = (3, 4), 5  # image-like samples: flattened to 12 features for the classifier's MLP


def write_split(path: Path, size: int, seed: int, **replace: np.ndarray) -> None:
    """A learnable split: the label is the argmax of a fixed linear map of the sample."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, *SHAPE))  # float64, numpy's default
    y = (x.reshape(size, -1) @ np.random.default_rng(0).normal(size=(12, CLASSES))).argmax(axis=1)
    arrays = {"x": x, "y": y, **replace}
    if path.suffix == ".npz":
        np.savez(path, **arrays)
    else:
        torch.save({name: torch.as_tensor(value) for name, value in arrays.items()}, path)


@pytest.mark.slow
def test_files_train_and_size_the_model(tmp_path, train):
    data = tmp_path / "data"
    data.mkdir()
    write_split(data / "train.npz", 256, seed=1)
    write_split(data / "val.pt", 64, seed=2)
    write_split(data / "test.npz", 32, seed=3)
    run = train(*QUICK, "data=files", f"data.dir={data}", "data.batch_size=64", "test_after_fit=true")
    wandb = run.wandb
    assert len(wandb.metric("train/loss")) == 4 and len(wandb.metric("val/loss")) == 1
    assert len(wandb.metric("test/acc")) == 1, "the test split is evaluated when the folder has one"
    config = wandb.config
    assert (config["data"]["num_features"], config["data"]["num_classes"]) == (12, CLASSES)
    assert (config["model"]["net"]["in_features"], config["model"]["net"]["num_classes"]) == (12, CLASSES)
    assert config["data"]["splits"] == ["train", "val", "test"]


@pytest.mark.slow
def test_a_dataset_class_of_your_own_trains(tmp_path, train):
    run = train(
        *QUICK,
        "data=custom",
        "data.dataset._target_=custom_dataset.Parity",
        "+data.dataset.size=256",
        "+data.dataset.label_dtype=int32",  # (cross-entropy takes int64: the loss converts them)
        "data.num_features=6",
        "data.num_classes=2",
        "data.splits=[train,val]",
        "data.batch_size=64",
        "test_after_fit=true",  # no test split: nothing to test, no error
    )
    assert len(run.wandb.metric("train/loss")) == 4 and len(run.wandb.metric("val/loss")) == 1
    assert run.wandb.metric("test/acc") == []


@pytest.mark.slow
def test_a_training_whose_loss_turns_nan_stops_in_one_line(train):
    """A NaN in training sample 100, past the 64 the checks before training read: every step after it, and the
    validation, are NaN. The run went on to its end and exited 0, its best checkpoint chosen among NaNs; then it
    stopped at the validation, the steps before it trained in NaN (and without a validation, not at all)."""
    run = train(
        *QUICK,
        "data=custom",
        "data.dataset._target_=custom_dataset.Parity",
        "+data.dataset.size=256",
        "+data.dataset.nan_at=100",
        "data.num_features=6",
        "data.num_classes=2",
        "data.splits=[train,val]",
        "data.batch_size=64",
        "trainer.max_epochs=2",
        check=False,
    )
    errors = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert run.returncode == 1 and "Traceback" not in run.output, run.output[-3000:]
    # At the first logged step with the NaN sample: one line, before any validation
    assert len(errors) == 1 and re.fullmatch(r"error: train/loss is nan at step \d+: .*", errors[0]), errors
    assert errors[0].endswith(
        "(a learning rate too high, or NaN in training samples past those checked before training); stopped. Its "
        "checkpoints saved since may hold those weights: start again from an earlier one (the best in its checkpoints "
        "folder, with ckpt_path=PATH resume=false) or afresh, with a lower model.optimizer.lr"
    ), errors
    metrics = run.run_dir / "metrics.jsonl"  # (none at all where nothing was logged)
    assert not metrics.exists() or "val/loss" not in metrics.read_text(), "stopped before validating NaN weights"


def test_a_checkpoint_removed_while_it_is_read_is_said_in_one_line(train):
    """ckpt_path= a run that is still training: it removes its older checkpoints as it saves, and a training started
    from one read a file that was gone (a FileNotFoundError's traceback)."""
    parity = ["data=custom", "data.dataset._target_=custom_dataset.Parity", "+data.dataset.size=64"]
    sizes = ["data.num_features=6", "data.num_classes=2", "data.splits=[train,val]", "data.batch_size=32"]
    first = train(*QUICK, *parity, *sizes)
    checkpoints = first.run_dir / "checkpoints"
    removing = ["data.dataset._target_=custom_dataset.RemovesAFolder", f"+data.dataset.folder={checkpoints}"]
    run = train(*QUICK, *parity, *sizes, *removing, f"ckpt_path={first.run_dir}", check=False)
    errors = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert run.returncode == 1 and "Traceback" not in run.output, run.output[-3000:]
    assert len(errors) == 1 and errors[0].startswith(f"error: ckpt_path={checkpoints}/"), errors
    said = (
        " was removed while it was read: the training that wrote it is running and keeps only its newest; give it "
        "again (a run folder: its newest), or copy a checkpoint out first"
    )
    assert errors[0].endswith(said), errors


def test_a_dataset_that_augments_in_loader_workers_resumes_exactly():
    """Noise drawn in __getitem__ by 2 loader worker processes: a loader resumed after 3 batches (its state, as a
    checkpoint holds it) hands out the batches the uninterrupted one did, noise included. (Each worker's random
    stream, which no checkpoint holds, started over and drew other noise: each sample now draws from its own seed,
    (data.seed, epoch, index).) tests/test_resume.py checks it on a real training, killed and started again."""

    def noisy(split: str) -> NoisyParity:
        return NoisyParity(split, size=96)

    def batches(state: dict | None, count: int) -> list[torch.Tensor]:
        data = Data(noisy, batch_size=8, splits=["train", "val"], num_workers=2, shuffle=True, seed=3)
        loader = data.loader("train")
        loader.load_state_dict(state or {"epoch": 1, "samples_done": 0})
        return [x for x, _ in itertools.islice(loader, count)]

    uninterrupted = batches(None, 6)
    resumed = batches({"epoch": 1, "samples_done": 3 * 8}, 3)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[3:], resumed, strict=True))
    plain = NoisyParity("train", size=96)
    assert not torch.equal(plain[0][0], plain[0][0]), "the dataset does draw new noise at every read"


def test_each_split_is_constructed_once_with_its_name():
    made = []

    def dataset(split: str) -> Parity:
        made.append(split)
        return Parity(split, size=40)

    data = Data(dataset, batch_size=8, splits=["train", "val"])
    for _ in range(2):
        data.loader("train"), data.loader("val")
    assert made == ["train", "val"]
    assert data.workers(processes_per_node=1) == 0, "an int num_workers is taken as is"
    assert Data(dataset, num_workers="auto").workers(processes_per_node=10**6) == 0, "auto: no more than the cores"


BAD = {
    "missing val": ({"val.pt": None}, "val.npz: not found (nor val.pt)"),
    "lengths": ({"train.npz": {"y": np.zeros(9, dtype=np.int64)}}, "train.npz: x has 10 samples, y has 9"),
    "float labels": ({"val.pt": {"y": np.zeros(10, dtype=np.float32)}}, "val.pt: y is float32; class labels must be"),
    "negative labels": ({"train.npz": {"y": np.full(10, -1)}}, "train.npz: y has negative labels (-1)"),
    "no y": ({"train.npz": {"y": None}}, "train.npz: needs x and y; it has x"),
    "empty samples": ({"val.pt": {"x": np.zeros((10, 0), dtype=np.int64)}},  # token sequences of length 0
                      "val.pt: x is shaped [10, 0]: each sample holds no value; give one or more"),
    "shapes": ({"val.pt": {"x": np.zeros((10, 3, 5))}}, "val.pt: samples are shaped x [3, 5], y []; train.npz's are"),
    "two formats": ({"train.pt": {}}, "train.npz: train.pt is there too; keep one train file"),
    "not an archive": ({"val.pt": "garbage"}, "val.pt: cannot be read"),
    "numpy in a .pt": ({"val.pt": {"numpy": True}}, "val.pt: cannot be read: it pickles numpy._core.multiarray."),
    "labels far apart": ({"train.npz": {"y": np.arange(10) * 10**6}},  # (a head of 9 000 001 outputs)
                         "the labels are 10 distinct ids from 0 to 9000000, and each id up to the largest is a class"),
    "uint8 images": ({"train.npz": {"x": np.zeros((10, *SHAPE), dtype=np.uint8)}},
                     "train.npz: x is uint8, but model.net's first layer embed (Linear) takes floating-point samples"),
}  # fmt: skip


def bad_folder(root: Path, changes: dict) -> Path:
    """train.npz and val.pt of 10 samples each, with `changes`: a file left out (None), garbage, or arrays replaced
    (an array set to None is left out)."""
    for name in ("train.npz", "val.pt", *changes):
        change = changes.get(name, {})
        if change is None:
            continue
        if isinstance(change, str):
            (root / name).write_text(change)
            continue
        write_split(root / name, 10, seed=0)
        arrays = {"x": np.zeros((10, *SHAPE)), "y": np.zeros(10, dtype=np.int64), **change}
        arrays = {key: value for key, value in arrays.items() if value is not None}
        if name.endswith(".npz"):
            np.savez(root / name, **arrays)
        elif arrays.pop("numpy", False):  # the arrays as they are: numpy's, pickled
            torch.save(arrays, root / name)
        else:
            torch.save({key: torch.as_tensor(value) for key, value in arrays.items()}, root / name)
    return root


@pytest.mark.parametrize("case", list(BAD))
def test_bad_files_are_named_in_one_line(tmp_path, case):
    changes, message = BAD[case]
    folder = str(bad_folder(tmp_path, changes))
    with pytest.raises(ConfigError) as error:
        describe(folder)
        # What only the model tells (integer samples are for models that read token ids): the classifier's MLP.
        data = Data(partial(FilesDataset, dir=folder), splits=["train", "val"])
        check_input(ResidualMLP(12, CLASSES, hidden=8, depth=1), data)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith(str(tmp_path.resolve())), "the message starts with the file"


def test_samples_the_classifier_cannot_take_are_refused_before_training(tmp_path):
    """The classifier's MLP checks each split's first sample (ResidualMLP.check_input): a wrong data.num_features
    (a Dataset of yours) or unflattened samples would fail in the first step's matrix product."""
    write_split(tmp_path / "train.npz", 10, seed=0)
    write_split(tmp_path / "val.npz", 10, seed=1)
    flat = Data(partial(FilesDataset, dir=str(tmp_path)), splits=["train", "val"])
    check_input(ResidualMLP(12, CLASSES, hidden=8, depth=1), flat)
    with pytest.raises(ConfigError) as refused:
        check_input(ResidualMLP(32, CLASSES, hidden=8, depth=1), flat)
    assert str(refused.value) == (
        "the data's samples have 12 values, the model takes 32 (model.net.in_features, which reads "
        "data.num_features): set data.num_features=12"
    )
    shaped = Data(partial(FilesDataset, dir=str(tmp_path), flatten=False), splits=["train", "val"])
    with pytest.raises(ConfigError, match=r"the data's are of shape \(3, 4\): flatten them \(data=files: data.fl"):
        check_input(ResidualMLP(12, CLASSES, hidden=8, depth=1), shaped)


class DictOutput(nn.Module):
    """Logits in a dict, beside something else, as many research models return them."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(12, CLASSES)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.linear(x), "features": x}


class ReadsAValue(nn.Module):
    """Token ids to logits through an embedding, reading a value of its input first, as transformers' models do
    (`.item()`), which the meta device cannot."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert int(x.max()) >= 0
        return self.embed(x)


def on_meta(build):
    with torch.device("meta"):
        return build()


def channels_first(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.utils.data.default_collate(samples)
    return x.permute(0, 3, 1, 2), y


def as_dict(samples: list) -> dict[str, torch.Tensor]:
    x, y = torch.utils.data.default_collate(samples)
    return {"input_ids": x, "labels": y}


def with_mask(samples: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = torch.utils.data.default_collate(samples)
    return x, y, torch.ones_like(x)


def padded_to_48(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.utils.data.default_collate(samples)
    return F.pad(x, (0, 48 - x.shape[1])), F.pad(y, (0, 48 - y.shape[1]), value=-100)


def test_a_net_the_loss_cannot_train_on_this_data_is_refused_before_training(tmp_path):
    """check_output runs the net's forward on the meta device (shapes only) on the first sample, and reads the first
    samples' targets: what would fail in the first step, or train on labels the net has no logit for, is refused."""
    write_split(tmp_path / "train.npz", 10, seed=0)
    write_split(tmp_path / "val.npz", 10, seed=1)
    data = Data(partial(FilesDataset, dir=str(tmp_path)), splits=["train", "val"])
    check_output(on_meta(lambda: ResidualMLP(12, CLASSES, hidden=8, depth=1)), data, cross_entropy)
    largest = int(np.load(tmp_path / "train.npz")["y"].max())
    assert largest >= 2
    with pytest.raises(ConfigError) as refused:
        check_output(on_meta(lambda: ResidualMLP(12, 2, hidden=8, depth=1)), data, cross_entropy)
    assert str(refused.value) == (
        f"the data has target {largest} (in its train split), but model.net ResidualMLP gives 2 classes (0 to 1): "
        "set data.num_classes (or the model's size) to the largest target + 1"
    )
    with pytest.raises(ConfigError, match="model.net DictOutput returns a dict, but the loss takes one tensor of"):
        check_output(on_meta(DictOutput), data, cross_entropy)
    with pytest.raises(ConfigError, match=r"cannot take the data's samples of shape \(12,\) \(a and b must have"):
        check_output(on_meta(lambda: nn.Linear(7, CLASSES)), data, cross_entropy)
    # Layers other than Linear: their errors on the meta device went by as "the meta device's", to a traceback in
    # the first step (a CNN given flat vectors, a norm or an RNN of another width)
    for layer in (
        partial(nn.Conv2d, 3, 4, 3),
        partial(nn.LayerNorm, 7),
        partial(nn.BatchNorm1d, 7),
        partial(nn.LSTM, 7, 4),
    ):
        with pytest.raises(ConfigError, match=r"cannot take the data's samples of shape \(12,\)"):
            check_output(on_meta(layer), data, cross_entropy)
    # ...but the net is given what a collate of yours makes of the samples: images stored HWC, put channels first
    hwc = Data(partial(tensors, torch.randn(4, 8, 8, 3), torch.zeros(4, dtype=torch.long)), splits=["train", "val"])
    conv = lambda: nn.Sequential(nn.Conv2d(3, CLASSES, 8), nn.Flatten())  # noqa: E731
    with pytest.raises(ConfigError, match=r"samples of shape \(8, 8, 3\) \(Invalid channel dimensions\)"):
        check_output(on_meta(conv), hwc, cross_entropy)
    hwc.collate_fn = channels_first
    check_output(on_meta(conv), hwc, cross_entropy)
    # what a collate of yours returns is an (x, y) pair, checked as the model's own checks see it (they were a
    # traceback in the first step, or a refusal after the run folder and wandb run were made)
    collates = [
        (as_dict, "returns a dict, but the training takes (x, y) batches"),
        (with_mask, "returns 3 items, but the training takes (x, y) batches"),
        (padded_to_48, "sequences of 48 tokens are longer than the model's max_seq_len=40"),
    ]
    for returned, refusal in collates:
        tokens = Data(partial(tensors, torch.randint(0, 8, (4, 6)), torch.zeros(4, 6, dtype=torch.long)))
        tokens.collate_fn = returned
        with pytest.raises(ConfigError, match=re.escape(refusal)):
            check_output(on_meta(lambda: GPT(8, 40, dim=8, depth=1, num_heads=2)), tokens, cross_entropy)
    # samples whose x is a dict (a tokenizer's): the forward is checked too (were not, a dict out failed at step 1)
    inputs = [{"ids": torch.zeros(6, dtype=torch.long), "mask": torch.ones(6)} for _ in range(4)]
    encoded = Data(partial(tensors, inputs, torch.zeros(4, dtype=torch.long)), splits=["train", "val"])
    check_output(on_meta(lambda: DictInput(as_dict=False)), encoded, cross_entropy)
    with pytest.raises(ConfigError, match="model.net DictInput returns a dict, but the loss takes one tensor"):
        check_output(on_meta(lambda: DictInput(as_dict=True)), encoded, cross_entropy)
    # token ids past the embedding: an IndexError in the first step
    ids = torch.randint(0, 8, (6, 5)).index_fill(0, torch.tensor([4]), 9)
    tokens = Data(partial(tensors, ids, torch.zeros(6, 5, dtype=torch.long)), splits=["train", "val"])
    with pytest.raises(ConfigError, match=r"the data has token id 9 \(in x of its train split\), but"):
        check_output(on_meta(lambda: GPT(8, 40, dim=8, depth=1, num_heads=2)), tokens, cross_entropy)
    # ...also by a net the meta device cannot run (model=causal_lm: its forward reads a value), as samples of
    # different lengths without a collate: the checks of the data's values were skipped, a traceback at step 0
    with pytest.raises(ConfigError, match=r"the data has token id 9 \(in x of its train split\), but"):
        check_output(on_meta(ReadsAValue), tokens, cross_entropy)
    ragged = Data(partial(tensors, [torch.zeros(5 + i % 2, dtype=torch.long) for i in range(6)], torch.zeros(6)))
    with pytest.raises(ConfigError, match=r"samples of different shapes \(\(5,\), \(6,\), ...\), which torch's"):
        check_output(on_meta(ReadsAValue), ragged, cross_entropy)
    two_rows = lambda: nn.Sequential(nn.Linear(12, 2 * CLASSES), nn.Unflatten(1, (2, CLASSES)))  # noqa: E731
    with pytest.raises(ConfigError, match=r"gives logits of shape \(2, 5\) per sample for targets of shape \(\)"):
        check_output(on_meta(two_rows), data, cross_entropy)
    one_score = lambda: nn.Sequential(nn.Linear(12, 1), nn.Flatten(0))  # noqa: E731 (it was "gives 1 classes")
    with pytest.raises(ConfigError, match=r"gives logits of shape \(\) per sample for targets of shape \(\)"):
        check_output(on_meta(one_score), data, cross_entropy)


def tensors(x: torch.Tensor | list[torch.Tensor], y: torch.Tensor, split: str) -> TensorDataset | list:
    """The same samples for every split: a TensorDataset, or a list of (x, y) (samples of different shapes)."""
    return TensorDataset(x, y) if isinstance(x, torch.Tensor) else list(zip(x, y, strict=True))


class DictInput(nn.Module):
    """A sequence classifier of a tokenizer's dict, returning its logits alone or in a dict."""

    def __init__(self, as_dict: bool) -> None:
        super().__init__()
        self.embed, self.head, self.as_dict = nn.Embedding(8, 4), nn.Linear(4, CLASSES), as_dict

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        logits = self.head((self.embed(x["ids"]) * x["mask"][..., None]).mean(dim=1))
        return {"logits": logits} if self.as_dict else logits


class MeanOverPositions(nn.Module):
    """(batch, positions, classes) -> (batch, classes): a sequence's class."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


class CountedStream(torch.utils.data.IterableDataset):
    """A stream of the user's own that also has a length: the training reads litdata's streams only."""

    def __init__(self, split: str) -> None:
        self.split = split

    def __iter__(self):
        yield from TensorDataset(torch.randn(4, 12), torch.zeros(4, dtype=torch.long))

    def __len__(self) -> int:
        return 4


class FloatLength(torch.utils.data.Dataset):
    """A Dataset whose __len__ gives a float (len() refuses it)."""

    def __init__(self, split: str) -> None:
        self.split = split

    def __getitem__(self, index: int):
        return torch.zeros(12), 0

    def __len__(self):
        return 4.0


def test_data_a_training_cannot_use_is_refused_before_it_starts(tmp_path):
    """Each was a traceback at the first step (or a KeyError, an IndexError, litdata's RuntimeError) after the run
    folder was made, or trained without a word: labels of shape (1,) (the loss flattens them, the accuracy broadcast
    them: val/acc 4.07 in the Accelerate engine), a NaN in x (every loss NaN, exit 0)."""
    x, y = torch.randn(8, 12), torch.randint(0, CLASSES, (8,))
    net = lambda: nn.Linear(12, CLASSES)  # noqa: E731
    refusals = [
        (x, y[:, None], "for targets of shape (1,): the loss takes one row of logits per target ((classes,) for a "
                        "label, (positions, vocabulary) for a sequence) (labels of shape (1,): return each as a"),
        (x.index_fill(0, torch.tensor([3]), math.nan), y, "TensorDataset(split='train'): sample 3's x has NaN or "
                                                            "infinite values, which make the loss NaN"),
        (x, y.index_fill(0, torch.tensor([2]), -1), "the data has target -1 (in its train split): class targets are 0 "
                                                     "to the number of classes - 1 (-100: left out"),
        (x, y.index_fill(0, torch.tensor([2]), -100), None),  # cross-entropy leaves -100 out: fine
        (x, y.index_fill(0, torch.tensor([2]), -100).index_fill(0, torch.tensor([4]), 9), "the data has target 9 ("),
        ([torch.randn(length, 12) for length in (2, 2, 3)], y[:3], "data.dataset list(split='train'): samples of "
                                                                  "different shapes ((2, 12), (3, 12), ...), which"),
    ]  # fmt: skip
    lengths = [torch.randn(length, 12) for length in (2, 2, 3)]
    one_per_process = Data(partial(tensors, lengths, y[:3]), splits=["train", "val"])
    pooled = lambda: nn.Sequential(nn.Linear(12, CLASSES), MeanOverPositions())  # noqa: E731
    check_output(on_meta(pooled), one_per_process, cross_entropy, micro_batch_size=1)  # collate stacks one sample
    # BatchNorm trained on one sample per micro-batch, a net with nothing to train: tracebacks at the first step
    normed = lambda: nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.Linear(8, CLASSES))  # noqa: E731
    plain = Data(partial(tensors, x, y), splits=["train", "val"])
    check_output(on_meta(normed), plain, cross_entropy, micro_batch_size=2)
    with pytest.raises(ConfigError, match=r"has BatchNorm, which trains on more than one value per channel, and each"):
        check_output(on_meta(normed), plain, cross_entropy, micro_batch_size=1)
    two_arguments = Data(partial(tensors, x, y), splits=["train", "val"], collate_fn=lambda samples, pad: samples)
    with pytest.raises(ConfigError, match=r"<lambda> fails on a list of one sample \(TypeError: "):
        check_output(on_meta(net), two_arguments, cross_entropy)  # (a traceback, before)
    frozen = on_meta(net).requires_grad_(False)
    with pytest.raises(ConfigError, match=r"model.net Linear has no trainable parameters \(none, or every one frozen"):
        check_output(frozen, plain, cross_entropy)
    for x_, y_, refusal in refusals:
        data = Data(partial(tensors, x_, y_), splits=["train", "val"])
        if refusal is None:
            check_output(on_meta(net), data, cross_entropy)
            continue
        with pytest.raises(ConfigError) as refused:
            check_output(on_meta(net), data, cross_entropy)
        assert refusal in str(refused.value)
    refusals = [  # (the data, the line); check_input: the net's own weights, each split
        (Data(partial(tensors, x.double(), y)), "x is float64, but the model has float32 weights: return x as"),
        # float16 in an fp32 training (no autocast), x as lists, text targets: tracebacks at the first step
        (Data(partial(tensors, x.half(), y)), "x is float16, but the model has float32 weights: return x as float32"),
        (Data(partial(tensors, x.tolist(), y)), "x is a Python list, which torch's default collate turns into a list"),
        (Data(partial(tensors, list(x), ["cat"] * 8)), "y is text ('cat'), but the training takes class ids 0 to"),
        (Data(partial(tensors, x, y), splits=["train"]), "data.splits=['train'] has no val: the training needs train "
                                                          "and val (test is optional: data.splits=[train,val])"),
        (Data(lambda split: TensorDataset(x[: 8 * (split != "test")], y[: 8 * (split != "test")])),
         "data.dataset TensorDataset(split='test') has no samples: give the split data, or leave it out of data.split"),
        (Data(CountedStream), "data.dataset CountedStream is an IterableDataset, which the training reads only"),
        # a traceback at the first step
        (Data(FloatLength), "data.dataset FloatLength(split='train'): len() fails ('float' object cannot be interpre"),
    ]  # fmt: skip
    for data, refusal in refusals:
        with pytest.raises(ConfigError) as refused:
            check_input(net(), data)
        assert refusal in str(refused.value)
    no_val = Data(lambda split: TensorDataset(x[: 8 * (split != "val")], y[: 8 * (split != "val")]))
    with pytest.raises(ConfigError) as refused:  # (not "or leave it out of data.splits": the training needs val)
        check_input(net(), no_val)
    assert str(refused.value) == "data.dataset TensorDataset(split='val') has no samples: give the split data"
    # Weights in bf16 and float32 samples: a dtype error at the first step, unless autocast casts them (bf16-mixed),
    # which float16 samples for float32 weights pass too; float64 it does not cast.
    bf16 = r"x is float32, but the model has bfloat16 weights: return x as bfloat16 from __getitem__ or store it so "
    with pytest.raises(ConfigError, match=bf16 + r"\(e.g. x.to\(torch.bfloat16\)\), or train with trainer.precision="):
        check_input(net().to(torch.bfloat16), Data(partial(tensors, x, y)))
    check_input(net().to(torch.bfloat16), Data(partial(tensors, x, y)), mixed_precision=True)
    check_input(net(), Data(partial(tensors, x.half(), y)), mixed_precision=True)
    with pytest.raises(ConfigError, match="x is float64, but the model has float32 weights: return x as float32 "):
        check_input(net(), Data(partial(tensors, x.double(), y)), mixed_precision=True)
    check_input(CastsItself(), Data(partial(tensors, x, y)))  # a forward that casts x to its weights' bf16
    # uint8 images for a net with an nn.Embedding (a ViT's positions): taken for ids (a dtype error in its first
    # layer, or "the data has token id 255" and advice to grow a vocabulary it does not have). The first layer its
    # forward gives x to decides: a Linear takes floats (x / 255 in the forward: passed), an nn.Embedding int64 ids.
    pixels = Data(partial(tensors, (x * 50).abs().to(torch.uint8), y))
    with pytest.raises(ConfigError, match=r"x is uint8, but model.net's first layer patches \(Linear\) takes floating"):
        check_input(Positions(scaled=False), pixels)
    check_input(Positions(scaled=True), pixels)
    with pytest.raises(ConfigError, match=r"x is uint8, but model.net's first layer 0 \(Embedding\) looks up ids as "):
        check_input(nn.Sequential(nn.Embedding(256, 4), nn.Flatten(), nn.Linear(48, CLASSES)), pixels)
    check_input(Bytes(), pixels)  # a byte-level net: its forward looks the bytes up as int64
    write_split(tmp_path / "train.npz", 10, seed=0, x=np.full((10, *SHAPE), np.inf))
    with pytest.raises(ConfigError, match=r"train.npz: x has NaN or infinite values \(sample 0 first\)"):
        FilesDataset("train", str(tmp_path))
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "train.csv").write_text("1,2,3\n")
    with pytest.raises(
        ConfigError, match=r"train.npz: not found \(nor train.pt\); data=files needs train and val \(tr"
    ):
        FilesDataset("train", str(tmp_path / "csv"))


def values(split: str, shape: tuple[int, ...] = ()) -> TensorDataset:
    """A regression split: 8 samples of 12 features, float targets of `shape` each."""
    return TensorDataset(torch.randn(8, 12), torch.randn(8, *shape))


def test_the_loss_is_checked_on_what_the_net_gives_for_the_datas_targets():
    """Float targets (regression) with the engines' cross-entropy, a loss of yours that would broadcast (B, 1)
    against (B,), are refused in one line before training; the same data with a loss and output that fit passes."""
    data = Data(values, splits=["train"])
    with pytest.raises(ConfigError) as refused:
        check_output(on_meta(lambda: nn.Linear(12, CLASSES)), data, cross_entropy)
    assert str(refused.value).startswith(
        "the loss cannot train model.net Linear on this data (output (5,) per sample, targets () float32): "
    ) and str(refused.value).endswith("cross-entropy takes class indices: store y as integers, or, for values "
                                      "(regression), train with a loss of yours (docs/your-model.md)")  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        check_output(on_meta(lambda: nn.Linear(12, 1)), data, F.mse_loss)
    assert str(refused.value) == (
        "the loss would broadcast model.net Linear's output against the targets (output (1,) per sample, targets () "
        "float32), comparing every prediction with every target: give them one shape (e.g. squeeze the output's last "
        "dimension)"
    )
    check_output(on_meta(lambda: nn.Sequential(nn.Linear(12, 1), nn.Flatten(0))), data, F.mse_loss)
    check_output(on_meta(lambda: nn.Linear(12, 1)), Data(partial(values, shape=(1,)), splits=["train"]), F.mse_loss)
    one_hot = Data(partial(values, shape=(CLASSES,)), splits=["train"])  # torch's words spoke of batch sizes
    with pytest.raises(ConfigError) as refused:
        check_output(on_meta(lambda: nn.Linear(12, CLASSES)), one_hot, cross_entropy)
    assert str(refused.value).startswith(
        "the loss cannot train model.net Linear on this data (output (5,) per sample, targets (5,) float32): targets "
        "shaped as the output are one-hot rows or class probabilities, not class indices; the template's loss "
    )
    soft_labels = lambda logits, y: -(y * logits.log_softmax(-1)).sum(-1).mean()  # noqa: E731 (a loss of yours)
    check_output(on_meta(lambda: nn.Linear(12, CLASSES)), one_hot, soft_labels)
    # One value per sample for float targets with the engines' cross-entropy: an IndexError at the first step
    one_value = on_meta(lambda: nn.Sequential(nn.Linear(12, 1), nn.Flatten(0)))
    with pytest.raises(ConfigError) as refused:
        check_output(one_value, data, cross_entropy)
    assert str(refused.value) == (
        "the loss cannot train model.net Sequential on this data (output () per sample, targets () float32): "
        "cross-entropy takes a row of class logits per target, not one value per sample; for values (regression), "
        "train with a loss of yours, e.g. MSE (docs/your-model.md)"
    )


def late_outlier(split: str, in_x: bool) -> TensorDataset:
    """Token sequences whose validation split has an id (or a target) of 9 in its 151st sequence."""
    x, y = torch.randint(0, 8, (200, 5)), torch.randint(0, 8, (200, 5))
    if split == "val":
        (x if in_x else y)[150, 2] = 9
    return TensorDataset(x, y)


class ShiftedLabels(TensorDataset):
    """Labels stored 1 to 10, given as 0 to 9: what __getitem__ returns is what trains, not the stored rows."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().__getitem__(index)
        return x, y - 1


def test_ids_and_targets_held_in_memory_are_checked_whole():
    """data=files and data=tokens hold each split as two tensors: an id or a target past the model's sizes anywhere
    in them is refused before training (past the first training samples it was an IndexError at its step, a
    device-side assert on a GPU, at the first validation). A Dataset of yours is read for its first samples only."""
    gpt = on_meta(lambda: GPT(8, 40, dim=8, depth=1, num_heads=2))  # a vocabulary of 8: ids and classes 0 to 7
    with pytest.raises(ConfigError, match=r"^the data has token id 9 \(in x of its val split\), but model.net GPT "):
        check_output(gpt, Data(partial(late_outlier, in_x=True), splits=["train", "val"]), cross_entropy)
    with pytest.raises(ConfigError, match=r"^the data has target 9 \(in its val split\), but model.net GPT gives 8 "):
        check_output(gpt, Data(partial(late_outlier, in_x=False), splits=["train", "val"]), cross_entropy)
    padded = Data(partial(tensors, torch.full((6, 5), -1), torch.full((6, 5), -100)), splits=["train", "val"])
    negative = r"^the data has token id -1 \(in x of its train split\), but model.net GPT embeds ids 0 to 7: give "
    with pytest.raises(ConfigError, match=negative + r"every position of x an id of the vocabulary \(padding: one id"):
        check_output(gpt, padded, cross_entropy)  # (it said: set the vocabulary to the largest id + 1)
    shifted = Data(lambda split: ShiftedLabels(torch.randn(20, 4), torch.arange(20) % 10 + 1), splits=["train", "val"])
    check_output(on_meta(lambda: nn.Linear(4, 10)), shifted, cross_entropy)  # (refused: "target 10", 10 classes)
    ids = torch.randint(0, 8, (100, 5)).index_fill(0, torch.tensor([3]), 9)
    own = Data(partial(tensors, list(ids), torch.zeros(100, 5, dtype=torch.long)), splits=["train", "val"])
    with pytest.raises(ConfigError, match=r"^the data has token id 9 \(in x of its first 64 training samples\)"):
        check_output(gpt, own, cross_entropy)


def binary(split: str, largest: int = 1) -> TensorDataset:
    """A binary classification split: labels 0 and 1 (or up to `largest`)."""
    return TensorDataset(torch.randn(8, 12), torch.arange(8) % (largest + 1))


def test_a_binary_classifier_with_one_logit_trains_with_a_loss_of_its_own():
    """One logit per sample for labels 0 and 1, by binary cross-entropy (a loss of yours): it was refused as
    "logits of shape () for targets of shape ()"; its accuracy counts logits above 0 as class 1."""
    one_logit = on_meta(lambda: nn.Sequential(nn.Linear(12, 1), nn.Flatten(0)))
    bce = lambda logits, y: F.binary_cross_entropy_with_logits(logits, y.float())  # noqa: E731
    check_output(one_logit, Data(binary, splits=["train"]), bce)
    two = r"the data has target 2 \(in its train split\), but model.net Sequential gives one logit per "
    with pytest.raises(ConfigError, match=two + r"sample, a binary classifier's \(classes 0 and 1\)"):
        check_output(one_logit, Data(partial(binary, largest=2), splits=["train"]), bce)
    with pytest.raises(ConfigError, match=r"the loss takes one row of logits per target .*; a binary classifier's one "
                       r"logit per sample trains with a loss of yours \(binary cross-entropy\)$"):  # fmt: skip
        check_output(one_logit, Data(binary, splits=["train"]), cross_entropy)
    logits, labels = torch.tensor([2.0, -1.0, 0.5, -3.0]), torch.tensor([1, 1, 0, 0])
    assert correct_predictions(logits, labels) == 2  # 2.0 and -3.0 right
    assert correct_predictions(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1])) == 1  # argmax of rows
    assert correct_predictions(torch.randn(4, 3), torch.softmax(torch.randn(4, 3), dim=-1)) == 0  # values: none


def test_a_regression_target_of_minus_100_counts_in_the_metrics():
    """The eval sampler's padding sample: class targets IGNORED (-100), value targets NaN, so a real -100.0 counts."""
    predictions, targets = torch.zeros(3, 1), torch.tensor([[-100.0], [1.0], [math.nan]])
    loss_sum, count = summed_loss(F.mse_loss, predictions, targets)
    assert count == 2 and loss_sum == pytest.approx((100.0**2 + 1.0) / 2 * 2)


def test_data_dir_must_be_given():
    with pytest.raises(ConfigError, match="data.dir is not set: data=files data.dir=DIR"):
        describe(None)


@pytest.mark.slow
def test_a_bad_folder_stops_the_run_before_training(tmp_path, train):
    (tmp_path / "data").mkdir()
    folder = bad_folder(tmp_path / "data", {"val.pt": {"y": np.zeros(10, dtype=np.float32)}})
    run = train(*QUICK, "data=files", f"data.dir={folder}", check=False)
    run.assert_rejected(f"error: {folder.resolve() / 'val.pt'}: y is float32; class labels must be integers")


def test_samples_keep_their_shape_unless_flattened(tmp_path):
    write_split(tmp_path / "train.pt", 10, seed=0)
    write_split(tmp_path / "val.npz", 10, seed=1)
    assert FilesDataset("val", str(tmp_path))[0][0].shape == (12,)
    x, y = FilesDataset("train", str(tmp_path), flatten=False)[0]
    assert x.shape == SHAPE and x.dtype == torch.float32 and y.dtype == torch.int64
    assert describe(str(tmp_path))["sample_shape"] == list(SHAPE) == resolve(str(tmp_path), "sample_shape")
    with pytest.raises(ConfigError) as refused:  # (a KeyError inside OmegaConf's traceback of 76 lines)
        resolve(str(tmp_path), "sample_shap")
    assert str(refused.value) == (
        "${data_files:DIR,sample_shap}: sample_shap is not a field it reads; valid: num_features, sample_shape, "
        "num_classes, splits"
    )


class Positions(nn.Module):
    """A ViT's way in, flattened: samples to patch features plus a learned position (an nn.Embedding, not its input)."""

    def __init__(self, scaled: bool) -> None:
        super().__init__()
        self.scaled = scaled
        self.patches, self.positions, self.head = nn.Linear(12, 8), nn.Embedding(4, 8), nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255 if self.scaled else x  # (pixels as stored: uint8)
        return self.head(self.patches(x) + self.positions.weight[0])


class Bytes(nn.Module):
    """A byte-level net: uint8 samples are its ids, looked up as int64."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(256, 4), nn.Linear(48, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x.long()).flatten(1))


class CastsItself(nn.Module):
    """Weights in bf16, and a forward that casts its float32 input to them (as transformers' vision models do)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, CLASSES).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.to(self.fc.weight.dtype))
