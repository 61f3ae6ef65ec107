"""The default data: deterministic from the seed, learnable, and split exactly over replicas."""

import pytest
import torch
import torch.nn.functional as F
from conftest import PARITY, TOLERANCE
from custom_dataset import VariableLength
from layouts import command, layout

from {{ cookiecutter.package_name }}.config.command_line import check_seed_and_names
from {{ cookiecutter.package_name }}.data.batch_sizes import per_device_batch_size
from {{ cookiecutter.package_name }}.data.loading import Data
from {{ cookiecutter.package_name }}.data.synthetic import data_settings
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.runtime.real_targets import RealTargets


def first_batch(data: Data, replicas: int = 1, rank: int = 0) -> torch.Tensor:
    x, _ = next(iter(data.loader("train", replicas, rank)))
    return x


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = (Data(**data_settings(seed=seed)) for seed in (1, 1, 2))
    for data in (a, b, c):
        data.setup()
    assert torch.equal(a.splits["train"].tensors[0], b.splits["train"].tensors[0])
    assert torch.equal(a.splits["val"].tensors[1], b.splits["val"].tensors[1])
    assert not torch.equal(a.splits["train"].tensors[0], c.splits["train"].tensors[0])


def test_classes_are_balanced_enough_to_learn():
    data = Data(**data_settings(seed=0))
    data.setup()
    counts = torch.bincount(data.splits["train"].tensors[1], minlength=8)
    assert counts.min() > 0.3 * counts.float().mean(), counts.tolist()


@pytest.mark.parametrize("shuffle", [False, True])
def test_replicas_split_the_global_batch_exactly(shuffle):
    data = Data(**data_settings(batch_size=64, shuffle=shuffle, seed=0))
    single = first_batch(data)
    shards = [first_batch(data, replicas=4, rank=rank) for rank in range(4)]
    assert all(len(x) == 16 for x in shards)
    together = torch.cat(shards)
    assert sorted(together.sum(dim=1).tolist()) == pytest.approx(sorted(single.sum(dim=1).tolist()))


def test_indivisible_global_batch_is_refused():
    with pytest.raises(ConfigError, match="multiple of the 4 data-parallel replicas; nearest valid: 28 or 32"):
        Data(**data_settings(batch_size=30)).loader("train", replicas=4)


def global_batches(data: Data, replicas: int, epoch: int, state: dict | None = None) -> list[torch.Tensor]:
    """The epoch's global batches (replicas' shares concatenated), read from `state` on if given."""
    loaders = [data.loader("train", replicas, rank) for rank in range(replicas)]
    for loader in loaders:
        loader.sampler.set_epoch(epoch)
        if state:
            loader.load_state_dict(state)
            loader.sampler.set_epoch(epoch)  # what the engines do at the start of each epoch
    return [torch.cat(shares) for shares in zip(*([x for x, _ in loader] for loader in loaders), strict=True)]


@pytest.mark.parametrize(("replicas_after", "workers"), [(1, 0), (2, 0), (4, 0), (2, 2)])
def test_train_loader_resumes_mid_epoch_with_the_next_global_batch(replicas_after, workers):
    data = Data(**data_settings(batch_size=32, train_size=320, shuffle=True, seed=3, num_workers=workers))
    whole = global_batches(data, 2, epoch=1)
    loader = data.loader("train", 2, 0)
    loader.sampler.set_epoch(1)
    for done, _ in enumerate(loader, start=1):
        if done == 4:
            state = loader.state_dict()
            break
    assert state == {"epoch": 1, "samples_done": 4 * 32}
    resumed = global_batches(data, replicas_after, epoch=1, state=state)
    assert len(resumed) == len(whole) - 4
    for batch, expected in zip(resumed, whole[4:], strict=True):  # the same samples, in any replica order
        assert sorted(batch.sum(dim=1).tolist()) == pytest.approx(sorted(expected.sum(dim=1).tolist()))
    assert len(global_batches(data, replicas_after, epoch=2, state=state)) == len(whole), "only that epoch is cut"


def test_a_resume_with_another_global_batch_is_refused_unless_it_starts_at_the_same_sample():
    """A ckpt_path into another run may change the batch (fine-tuning); the epoch continues at the same sample."""
    state = {"epoch": 0, "samples_done": 96}
    with pytest.raises(ConfigError, match="global batches of 64: continue with a data.batch_size that divides 96"):
        Data(**data_settings(batch_size=64)).loader("train").load_state_dict(state)
    Data(**data_settings(batch_size=32)).loader("train").load_state_dict(state)


@pytest.mark.slow
def test_an_x_of_two_tensors_trains(train):
    """x as a tuple (a model of two inputs): the engine moves each tensor to the device (the Accelerate loop called
    .to on the tuple: a traceback after the run folder was written)."""
    settings = [*PARITY, "trainer.max_steps=2", "data=custom", "data.dataset._target_=custom_dataset.TwoViews"]
    settings += ["+data.dataset.size=128", "data.num_features=6", "data.num_classes=2", "data.num_workers=0"]
    settings += ["model.net._target_=own_models.TwoInputs", "~model.net.depth", "~model.net.expansion"]
    assert len(train(*settings, "~model.net.norm", "strategy=single").losses(2)) == 2


def test_samples_of_different_lengths_train_with_a_collate_fn_of_yours(train):
    """data.collate_fn: sequences of different lengths, padded per batch by a function of yours (labels with -100),
    train under ddp with accumulated micro-batches, and in 2 pipelines of 2 stages, as on one device. It was no
    setting (+data.collate_fn was dropped silently, then torch's collate failed in a 78-line traceback); then the
    replicas' and micro-batches' mean losses were averaged as if each held as many real targets (1e-3 off); the
    pipelines crashed at the first batch of another length (their stages had sized their buffers on the first).
    A name that does not import is refused in one line."""
    with pytest.raises(ConfigError, match="data.collate_fn=custom_dataset.nothing does not import"):
        Data(VariableLength, collate_fn="custom_dataset.nothing")
    settings = [*PARITY, "trainer.max_steps=3", "data=custom", "data.dataset._target_=custom_dataset.VariableLength"]
    settings += ["trainer.max_epochs=-1"]  # no limit of epochs, as in Lightning (the accelerate loop trained none)
    settings += ["+data.dataset.size=256", "data.num_features=4", "data.num_classes=2", "data.num_workers=0"]
    settings += ["data.collate_fn=custom_dataset.pad_batch", "data.batch_size=8"]  # 2 sequences per replica's part
    settings += ["model.net._target_=own_models.Tagger", "model.net.hidden=16", "model.net.depth=2"]
    single = train(*settings, "strategy=single").losses(3)
    overrides, launcher = command(layout("ddp"))
    ddp = train(*settings, *overrides, "trainer.accumulate_grad_batches=2", launcher=launcher).losses(3)
    assert ddp == pytest.approx(single, abs=TOLERANCE)
    overrides, launcher = command(layout("pipeline-dp2"))
    pipelines = train(*settings, *overrides, launcher=launcher)  # 4 micro-batches of 1 sequence
    assert pipelines.losses(3) == pytest.approx(single, abs=TOLERANCE)
    assert "note: strategy=pipeline: batch shapes change" in pipelines.output


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2), target.flatten())


@pytest.mark.parametrize("padded", [True, False])
def test_a_padded_batch_has_the_same_loss_and_gradient_however_it_is_split(padded):
    """runtime/real_targets.py, in one process: a batch of token targets with padding (-100) of its own in every
    sample, trained as 2 accumulated micro-batches each split in 2 by sample share (as the OOM recovery and a pipeline
    split), gives the whole batch's loss and gradient; the per-chunk means weighed alike were 7e-2 off. Without
    padding every weight is exactly 1: the losses are bit for bit the plain means. (Replicas: the ddp test above.)"""
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(8, 5, 3, generator=generator), torch.randn(3, 4, generator=generator)
    y = torch.randint(0, 4, (8, 5), generator=generator)
    if padded:
        y[torch.arange(5) >= torch.randint(1, 6, (8, 1), generator=generator)] = -100
    weight.requires_grad_(True)
    whole = cross_entropy(x @ weight, y)
    (expected,) = torch.autograd.grad(whole, weight)

    accumulate, targets, step_loss, unweighted = 2, RealTargets(2), 0.0, 0.0
    loss_fn = targets.weighted(cross_entropy)
    for micro_x, micro_y in zip(x.chunk(accumulate), y.chunk(accumulate), strict=True):
        targets.count(micro_y)
        for part_x, part_y in zip(micro_x.chunk(2), micro_y.chunk(2), strict=True):
            loss = loss_fn(part_x @ weight, part_y) * len(part_x) / len(micro_x)
            (loss / accumulate).backward()
            step_loss, unweighted = step_loss + loss.detach(), unweighted + cross_entropy(part_x @ weight, part_y) / 4
            if not padded:
                assert torch.equal(loss_fn(part_x @ weight, part_y), cross_entropy(part_x @ weight, part_y))
    targets.scale_gradients([weight])
    assert step_loss / accumulate * targets.factor() == pytest.approx(whole.item(), rel=1e-6)
    assert torch.allclose(weight.grad, expected, rtol=1e-5, atol=1e-7)
    assert (abs(unweighted.item() - whole.item()) > 1e-2) == padded  # what an unweighted split computed
    shorter = RealTargets(accumulate=2)  # a step of one micro-batch of 2 (an epoch's last, Lightning's loop)
    shorter.count(y[:4])
    assert shorter.factor() == 1  # its own mean, as Lightning scales it (the factor was 2: the gradient doubled)


def test_values_read_from_the_environment_are_taken_or_told_how():
    """`seed=${oc.decode:${oc.env:SEED}}`, the form the refusals advise, was refused as "not a whole number" (the
    check read its text); `data.batch_size=${oc.env:BATCH}` (text) was "128 must be a whole number"."""
    check_seed_and_names(["seed=${oc.decode:${oc.env:SEED}}"])
    with pytest.raises(ConfigError, match=r"seed=1.5 must be a whole number"):
        check_seed_and_names(["seed=1.5"])
    with pytest.raises(ConfigError, match=r"data.batch_size=128 must be .*: give \$\{oc.decode:\$\{oc.env:NAME\}\}"):
        per_device_batch_size("128", 1)
