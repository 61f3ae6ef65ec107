"""Data and a net that cannot train together, refused in one line before the training starts (and before
anything is written): an input the net's first layer cannot take, an output the loss cannot compare with the
targets, targets outside the classes, NaN samples, an evaluation share that leaves no batch."""

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset, IterableDataset, TensorDataset, default_collate

from ..errors import ConfigError
from ..runtime.optimization import check_trainable
from . import IGNORED
from .files import FilesDataset, Range, split_ranges, value_range
from .loading import Data

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
    held = whole_splits(data)  # the range of each split's ids and targets, where they are two tensors
    for split, (ids, _) in held.items():
        check_token_ids(net, ids, f"its {split} split")
    if not held:
        inputs = [item[0], *(sample[0] for sample in samples)]
        check_token_ids(net, samples_range(inputs), f"its first {len(inputs)} training samples")
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
    if held:
        for split, (_, targets) in held.items():
            check_targets(name, targets, f"its {split} split", logits.shape[-1], binary)
    else:
        labels = [y[0], *(sample[1] for sample in samples)]
        where = f"its first {len(labels)} training samples"
        check_targets(name, samples_range(labels, IGNORED), where, logits.shape[-1], binary)


# The datasets whose items are their tensors' rows as stored (FilesDataset only widens narrow integers): a subclass
# that changes them in __getitem__ (labels shifted by one, say) is read for its first samples, as any Dataset is.
AS_STORED = (TensorDataset.__getitem__, FilesDataset.__getitem__)


def whole_splits(data: Data) -> dict[str, tuple[Range | None, Range | None]]:
    """The range of each split's ids (an integer x; None for floats) and targets (but -100), where every split is
    held as (x, y) tensors (data=files, data=tokens, a TensorDataset of yours): checked whole, where a Dataset of
    yours is read for its first samples only (an id or target past the model's sizes after them: an IndexError at
    its step, a device-side assert on a GPU). data=files's come with the sizes its config read (split_ranges), one
    pass over each file per process; in-memory tensors are read a chunk of samples at a time."""
    held = {}
    for split, dataset in data.splits.items():
        if not (isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2):
            return {}
        if type(dataset).__getitem__ not in AS_STORED:
            return {}
        if isinstance(dataset, FilesDataset):
            held[split] = split_ranges(dataset.path)
        else:
            x, y = dataset.tensors
            ids = None if x.is_floating_point() or x.dtype == torch.bool else value_range(x)
            held[split] = ids, (None if y.is_floating_point() else value_range(y, IGNORED))
    return held


def samples_range(parts: list[Any], ignored: int | None = None) -> Range | None:
    """The range of the integer values in some samples' x (or y): those that are tensors, lists or numbers."""
    tensors = [torch.as_tensor(part) for part in parts if isinstance(part, torch.Tensor | list | int)]
    tensors = [t.reshape(-1) for t in tensors if t.numel() and not t.is_floating_point() and t.dtype != torch.bool]
    ranges = [found for t in tensors if (found := value_range(t, ignored)) is not None]
    return (min(low for low, _ in ranges), max(high for _, high in ranges)) if ranges else None


def check_targets(name: str, targets: Range | None, where: str, classes: int, binary: bool) -> None:
    """Class targets (`targets`: their range, but -100) from 0 to the net's classes - 1 (one logit per sample,
    `binary`: 0 and 1)."""
    if targets is None:  # (-100 alone: targets left out of the loss)
        return
    if (smallest := targets[0]) < 0:
        raise ConfigError(
            f"the data has target {smallest} (in {where}): class targets are 0 to the number of classes - 1 "
            f"({IGNORED}: left out of the loss)"
        )
    top = targets[1]
    if binary and top > 1:
        raise ConfigError(
            f"the data has target {top} (in {where}), but model.net {name} gives one logit per sample, a binary "
            "classifier's (classes 0 and 1): give it a row of logits per sample, one per class, for the template's "
            "cross-entropy, or, for values (a regression), store y as floats"
        )
    if not binary and top >= classes:
        raise ConfigError(
            f"the data has target {top} (in {where}), but model.net {name} gives {classes} classes (0 to "
            f"{classes - 1}): set data.num_classes (or the model's size) to the largest target + 1"
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


def check_token_ids(net: nn.Module, ids: Range | None, where: str) -> None:
    """Integer samples are ids a net's first nn.Embedding looks up (`ids`: their range; None: no integer x): one
    past its size was an IndexError in the first step (labels are checked against the classes apart). `where`: the
    samples', for the refusal."""
    embedding = next((module for module in net.modules() if isinstance(module, nn.Embedding)), None)
    if embedding is None or ids is None:
        return
    smallest, top = ids
    size = embedding.num_embeddings
    if smallest < 0:  # (padding, say: the targets leave it out as -100, but the input must look a row up)
        raise ConfigError(
            f"the data has token id {smallest} (in x of {where}), but model.net {type(net).__name__} embeds ids 0 to "
            f"{size - 1}: give every position of x an id of the vocabulary (padding: one id of its own, and -100 at "
            "its targets)"
        )
    if top >= size:
        raise ConfigError(
            f"the data has token id {top} (in x of {where}), but model.net {type(net).__name__} embeds {size} "
            f"(0 to {size - 1}): set the vocabulary (data.num_classes, or model.net.vocab_size) to the largest id + 1"
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
