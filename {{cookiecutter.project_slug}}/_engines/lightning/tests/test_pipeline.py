"""strategy=pipeline: how the model is split, what each stage owns, bad settings, and one real run.

Loss parity with a single device is checked in test_parity.py (rows pipeline-gpipe and pipeline-1f1b).
"""

from datetime import timedelta
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import PARITY, QUICK, TOLERANCE, checkpoint_files
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.data.synthetic import SyntheticData
from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.engine.module import Classifier
from {{ cookiecutter.package_name }}.engine.strategies import check_layout
from {{ cookiecutter.package_name }}.engine.strategies.pipeline import PipelineStrategy
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.split import pipeline_stage, split_blocks


@pytest.mark.parametrize(
    "blocks, stages, split_points, expected",
    [
        (4, 2, None, [range(0, 2), range(2, 4)]),
        (5, 2, None, [range(0, 3), range(3, 5)]),
        (4, 3, None, [range(0, 2), range(2, 3), range(3, 4)]),
        (4, 2, [1], [range(0, 1), range(1, 4)]),
    ],
)
def test_default_split_balances_blocks_and_split_points_override_it(blocks, stages, split_points, expected):
    assert split_blocks(blocks, stages, split_points) == expected


def test_each_stage_owns_only_its_parameters_and_together_they_are_the_net():
    torch.manual_seed(0)
    net = ResidualMLP(in_features=32, num_classes=8, depth=4)
    stages = [pipeline_stage(net, stage, 2) for stage in range(2)]
    names = [set(stage.state_dict()) for stage in stages]
    assert names[0].isdisjoint(names[1])
    assert names[0] | names[1] == set(net.state_dict()), "stage parameters keep the single-device names"
    assert {name.rsplit(".", 2)[0] for name in names[0] if name.startswith("blocks.")} == {"blocks.0", "blocks.1"}
    assert any(name.startswith("embed.") for name in names[0]) and not any("head" in name for name in names[0])
    assert any(name.startswith("head.") for name in names[1]) and not any("embed" in name for name in names[1])
    x = torch.randn(5, 32)
    assert torch.equal(stages[1](stages[0](x)), net(x))


def module(depth: int = 4) -> Classifier:
    return Classifier(ResidualMLP(in_features=32, num_classes=8, depth=depth), optimizer=torch.optim.AdamW)


@pytest.mark.parametrize(
    "devices, strategy, depth, batch, message",
    [
        (2, {"microbatches": 1}, 4, 64, "strategy.microbatches=1 is fewer than the 2 pipeline stages"),
        (2, {"microbatches": 4}, 4, 30, "data.batch_size=30 does not split into strategy.microbatches=4"),
        (2, {}, 1, 64, "2 pipeline stages need at least 2 blocks; the model has 1"),
        (2, {"split_points": [4]}, 4, 64, "split_points=[4] must be 1 increasing block indices between 1 and 3"),
        (1, {}, 4, 64, "strategy=pipeline runs one stage per process"),
    ],
    ids=["too-few-microbatches", "indivisible-batch", "more-stages-than-blocks", "bad-split", "one-device"],
)
def test_impossible_pipelines_are_refused_before_training(devices, strategy, depth, batch, message):
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=PipelineStrategy(**strategy), logger=False)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_layout("pipeline", trainer, batch, module(depth))


def test_16_mixed_is_refused_before_training():
    """One gradient scaler per stage would skip steps out of step. (On the CPU, Lightning turns 16-mixed into
    bf16-mixed before any check: the trainer's part the check reads stands in for a GPU trainer's.)"""
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=PipelineStrategy(), logger=False)
    on_gpu = SimpleNamespace(precision="16-mixed", accumulate_grad_batches=1, gradient_clip_val=None)
    with pytest.raises(ConfigError, match="strategy=pipeline supports trainer.precision=32-true or bf16-mixed, not 16"):
        trainer.strategy.check_layout(on_gpu, module(), 64)


def test_unknown_schedule_is_refused():
    with pytest.raises(
        ValueError, match="schedule='zero_bubble' is unknown; valid: gpipe, 1f1b, interleaved_1f1b, zbv"
    ):
        PipelineStrategy(schedule="zero_bubble")


def test_a_stage_waiting_for_a_broken_peer_times_out_instead_of_hanging():
    strategy = OmegaConf.load(CONFIG_DIR / "strategy" / "pipeline.yaml").strategy
    assert instantiate(strategy.timeout) <= timedelta(minutes=10), "gloo send/recv would otherwise wait 30 minutes"


def test_too_few_microbatches_fail_in_one_line_from_the_command_line(train):
    run = train(
        "strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2", "strategy.microbatches=1", check=False
    )
    assert run.returncode == 2
    assert [line for line in run.output.splitlines() if line.startswith("error:")] == [
        "error: strategy.microbatches=1 is fewer than the 2 pipeline stages, so stages would only take turns; "
        "use at least 2 (more micro-batches, smaller bubble)"
    ]
    assert "Traceback" not in run.output and not run.run_dir.exists()


@pytest.mark.slow
def test_pipeline_checkpoints_round_trip_through_one_device(train):
    pipeline = ["strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2", "data.shuffle=false"]
    # 8 steps an epoch (a whole epoch: Lightning logs the steps after resuming an epoch that limit_train_batches cut
    # short one step late).
    quick = [*QUICK, *pipeline, "data.train_size=512", "data.batch_size=64", "scheduler=constant"]
    run = train(*quick, "trainer.log_every_n_steps=2", "test_after_fit=true")
    wandb = run.wandb
    assert wandb.steps("train/loss") == [1, 3, 5, 7], "once per logging step, at the global step"
    assert len(wandb.metric("val/loss")) == len(wandb.metric("val/acc")) == 1
    stages = [pipeline_stage(module().net, stage, 2) for stage in range(2)]
    assert wandb.config["pipeline"] == {
        "stages": 2,
        "stages_per_process": 1,
        "pipelines": 1,
        "tensor_parallel_size": 1,
        "microbatches": 4,
        "schedule": "1f1b",
        "parameters_per_stage": [sum(p.numel() for p in stage.parameters()) for stage in stages],
        "bubble_fraction": 0.2,
    }
    for stage in range(2):
        idle = wandb.metric(f"pipeline/idle_fraction/stage{stage}")
        assert len(idle) == 4 and all(0 <= value < 1 for value in idle)

    # Each stage wrote only its own part of the checkpoint folder; load_trained puts them together on one device.
    [best] = (run.run_dir / "checkpoints").glob("best-*.ckpt")
    assert checkpoint_files(best, "state_dict.") == {
        "__0_0.distcp": stage_names(0, "state_dict.net."),
        "__1_0.distcp": stage_names(1, "state_dict.net."),
    }
    assert "state_dict" not in torch.load(best / "meta.pt", weights_only=False), "rank 0's file: no weights"
    single = load_trained(best)

    # The single-device model predicts what the pipeline predicted: the same test loss and accuracy.
    single.eval()
    with torch.no_grad():
        batches = [(single(x), y) for x, y in DataLoader(SyntheticData("test", train_size=512, seed=42), batch_size=64)]
    loss = torch.stack([single.loss(logits, y) for logits, y in batches]).mean().item()
    accuracy = torch.cat([logits.argmax(dim=-1) == y for logits, y in batches]).float().mean().item()
    assert loss == pytest.approx(wandb.metric("test/loss")[0], abs=1e-5)
    assert accuracy == pytest.approx(wandb.metric("test/acc")[0], abs=1e-6)

    # Resuming from the stages' parts (model and optimizer state, read in place by each stage) continues exactly as
    # one device trained without a stop (a constant learning rate: a cosine schedule would span each run's length).
    resume = ["trainer.max_epochs=3", "trainer.max_steps=11"]
    resumed = train(*quick, *resume, f"ckpt_path={run.run_dir / 'checkpoints' / 'last.ckpt'}")
    on_one_device = train(*quick, *resume, "strategy=single", "trainer.devices=1")
    assert resumed.wandb.steps("train/loss") == [8, 9, 10]
    assert resumed.losses(3) == pytest.approx(on_one_device.wandb.metric("train/loss")[8:], abs=1e-5)


def stage_names(stage: int, prefix: str) -> set[str]:
    """The names stage `stage` of 2 of the test's model saves its tensors under (single-device names)."""
    return {prefix + name for name in pipeline_stage(module().net, stage, 2).state_dict()}


@pytest.mark.slow
def test_the_item_logger_logs_the_last_stages_loss_means(train, single_losses):
    """oom.log_loss_mean=true: train/loss_mean, the mean loss of the steps since the last log, is the last
    stage's (the other stages have no loss on the steps that are not logged: it was NaN)."""
    overrides = ["strategy=pipeline", "trainer.devices=2", "oom.log_loss_mean=true"]
    run = train(*PARITY, *overrides, "trainer.log_every_n_steps=2")
    assert run.wandb.steps("train/loss_mean") == [1, 3, 5]
    expected = [(single_losses[step] + single_losses[step + 1]) / 2 for step in (0, 2, 4)]
    assert run.wandb.metric("train/loss_mean") == pytest.approx(expected, abs=TOLERANCE)
