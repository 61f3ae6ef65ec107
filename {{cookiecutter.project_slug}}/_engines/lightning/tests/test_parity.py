"""Loss parity of what one layout cannot show: shuffled data, accumulated micro-batches, sparse logging.

Same seed, same data order, same GLOBAL batch: the first K train/loss values logged to wandb must equal the
single-device run's within TOLERANCE. Every layout against single, in every precision, is test_presets.py's table.
"""

import pytest
from conftest import PARITY, TOLERANCE, K
from layouts import command, layout

pytestmark = pytest.mark.slow


def test_shuffled_runs_match_too(train, single_losses):
    """data.shuffle=true: the seeded sampler deals the same samples to each global batch on any layout."""
    shuffled = [*(o for o in PARITY if o != "data.shuffle=false"), "data.shuffle=true"]
    single = train(*shuffled, "strategy=single").losses(K)
    assert single != pytest.approx(single_losses, abs=TOLERANCE), "shuffling must change the batches"
    assert train(*shuffled, "strategy=ddp", "trainer.devices=2").losses(K) == pytest.approx(single, abs=TOLERANCE)


@pytest.mark.parametrize("name", ["single", "ddp"])
def test_accumulated_micro_batches_train_like_the_whole_global_batch(train, single_losses, name):
    """data.batch_size stays the global batch: as 2 accumulated micro-batches on each of 1 or 2 processes, every
    step computes, and logs, what one device computes on the whole batch at once."""
    overrides = ["strategy=single"] if name == "single" else ["strategy=ddp", "trainer.devices=2"]
    run = train(*PARITY, *overrides, "trainer.accumulate_grad_batches=2")
    assert run.wandb.steps("train/loss")[:K] == list(range(K)), "logged once per optimizer step"
    assert run.losses(K) == pytest.approx(single_losses, abs=TOLERANCE), name
    assert run.wandb.config["run"]["per_device_batch_size"] == 64 // 2 // run.wandb.config["run"]["world_size"]


@pytest.mark.parametrize("name", ["ddp", "model_parallel-dp2xtp2", "pipeline-gpipe"])
def test_logging_every_few_steps_still_logs_the_global_batch_loss(train, single_losses, name):
    """train/loss is averaged over the processes only on the steps that are logged, with the same result (a
    pipeline brings the last stage's loss to the other stages on those steps alone)."""
    overrides, launcher = command(layout(name))
    run = train(*PARITY, *overrides, "trainer.log_every_n_steps=3", launcher=launcher)
    assert run.wandb.steps("train/loss") == [2, 5]
    assert run.losses(2) == pytest.approx([single_losses[2], single_losses[5]], abs=TOLERANCE)


def test_a_regression_logs_its_loss_alone_and_alike_on_every_layout(train):
    """Float targets and a module of yours with MSE (docs/your-model.md): val/loss is that loss, the same under ddp
    as on one device; no val/acc or val/perplexity, which mean nothing for values."""
    values = [
        "data=custom",
        "data.dataset._target_=custom_dataset.Values",
        "+data.dataset.size=96",
        "data.num_workers=0",
    ]
    values += ["data.num_features=6", "data.num_classes=1", "+model._target_=own_modules.Regressor"]
    overrides = [*PARITY, *values, "trainer.max_steps=1", "trainer.val_check_interval=1"]
    single, ddp = (
        train(*overrides, "strategy=single").wandb,
        train(*overrides, "strategy=ddp", "trainer.devices=2").wandb,
    )
    assert len(single.metric("val/loss")) == 1 and ddp.metric("val/loss") == pytest.approx(single.metric("val/loss"))
    assert single.metric("val/acc") == ddp.metric("val/acc") == single.metric("val/perplexity") == []


def test_validation_takes_a_loss_of_yours_on_every_layout(train):
    """A module of yours with its own loss (label smoothing): val/loss is that loss under ddp as on one device (it
    was cross-entropy on several processes: the presets disagreed on the metric that picks the best checkpoint)."""
    overrides = [*PARITY, "trainer.max_steps=3", "trainer.val_check_interval=3"]
    overrides += ["+model._target_=own_modules.SmoothedClassifier"]
    single = train(*overrides, "strategy=single").wandb.metric("val/loss")
    ddp = train(*overrides, "strategy=ddp", "trainer.devices=2").wandb.metric("val/loss")
    assert len(single) == 1 and ddp == pytest.approx(single, abs=TOLERANCE)
