"""The optimisation settings, the same in both engines: parameter groups, the learning-rate schedule (logged as
train/lr), trainer.accumulate_grad_batches inside the global batch, and BatchNorm under data parallelism."""

import math

import pytest
import torch
from conftest import QUICK

from {{ cookiecutter.package_name }}.model import ResidualMLP
from {{ cookiecutter.package_name }}.optimization import grouped_optimizer


@pytest.mark.parametrize("norm", ["layer", "batch"])
def test_norms_and_biases_are_not_decayed(norm):
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2, norm=norm)
    optimizer = grouped_optimizer(torch.optim.AdamW, net.parameters(), no_decay_norms_and_biases=True)
    decayed = {id(p) for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}
    for name, param in net.named_parameters():
        is_norm_or_bias = name.endswith("bias") or ".norm." in f".{name}"
        assert (id(param) not in decayed) == is_norm_or_bias, name
    plain = grouped_optimizer(torch.optim.AdamW, net.parameters(), no_decay_norms_and_biases=False)
    assert len(plain.param_groups) == 1 and plain.param_groups[0]["weight_decay"] > 0


def expected_cosine(step: int, lr: float, warmup: int, total: int, ratio: float) -> float:
    """The schedule as configs/scheduler/cosine.yaml describes it: linear from lr / warmup to lr, then a cosine
    from lr down to lr x ratio at the end of training."""
    if step < warmup:
        return lr * (1 / warmup + (1 - 1 / warmup) * step / warmup)
    floor = lr * ratio
    return floor + (lr - floor) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


@pytest.mark.slow
def test_the_cosine_schedule_spans_the_epochs_optimizer_steps(train):
    """One epoch of 672 samples in global batches of 64, each 2 accumulated micro-batches: 10 optimizer steps (the
    half batch left over is not trained), and the schedule warms up over 3 of them and ends near its floor."""
    run = train(
        *QUICK,
        "trainer.accelerator=cpu",
        "data.train_size=672",
        "data.batch_size=64",
        "trainer.accumulate_grad_batches=2",
        "model.optimizer.lr=0.01",
        "scheduler=cosine",
        "scheduler.warmup_steps=3",
        "scheduler.min_lr_ratio=0.1",
    )
    assert run.wandb.steps("train/lr") == list(range(10))
    expected = [expected_cosine(step, 0.01, 3, 10, 0.1) for step in range(10)]
    assert run.wandb.metric("train/lr") == pytest.approx(expected, rel=1e-6)


# (overrides, the one error line); each refused before training (conftest's `refused` runs them)
BAD_INPUT = [
    (
        ["strategy=ddp_spawn", "trainer.devices=2", "data.batch_size=64", "trainer.accumulate_grad_batches=3"],
        "data.batch_size=64 is the global batch = micro-batch x trainer.accumulate_grad_batches=3 x 2 "
        "data-parallel replicas, so a positive multiple of 6; nearest valid: 60 or 66",
    ),
    (
        ["strategy=ddp_spawn", "trainer.devices=2", "trainer.accelerator=cpu", "model.net.norm=batch"],
        "strategy=ddp_spawn: the model's BatchNorm layers must be synchronised over the 2 processes",
    ),
{%- if cookiecutter.engine == "lightning" %}
    (  # shared code (tests/test_model_split.py checks it for both engines), reached here from the command line
        ["strategy=pipeline", "trainer.devices=2", "trainer.accelerator=cpu", "model.net.norm=batch"],
        "strategy=pipeline computes BatchNorm statistics per micro-batch",
    ),
{%- endif %}
]
CASE_NAMES = ["indivisible-accumulation", "batchnorm-on-cpu-processes", "batchnorm-under-pipeline"]


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=CASE_NAMES[: len(BAD_INPUT)])
def test_bad_input_fails_in_one_line(refused, case):
    refused[case].assert_rejected(BAD_INPUT[case][1])


@pytest.mark.slow
@pytest.mark.gpu(2)  # torch's SyncBatchNorm runs on GPUs only
def test_batchnorm_under_ddp_is_synchronised_and_trains_like_one_device(train):
    parity = [*QUICK, "trainer.max_steps=6", "data.shuffle=false", "data.batch_size=64", "model.net.norm=batch"]
    single = train(*parity, "strategy=single", "trainer.devices=1")
    ddp = train(*parity, "strategy=ddp_spawn", "trainer.devices=2")
    assert "BatchNorm layers synchronised across 2 processes" in ddp.output
    assert ddp.losses(6) == pytest.approx(single.losses(6), abs=1e-4)  # GPU reductions in another order
