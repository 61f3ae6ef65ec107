"""The default training learns and logs one wandb run; checkpoints resume and reload; evaluation's reduction."""

import json
import re
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from conftest import QUICK
from launchers import accelerate_launch
from torch import nn
from torch.utils.data import TensorDataset

from {{ cookiecutter.package_name }}.data.batch_sizes import check_limit
from {{ cookiecutter.package_name }}.data.loading import Data
from {{ cookiecutter.package_name }}.data.synthetic import SyntheticData
from {{ cookiecutter.package_name }}.data.tokens import TokenData
from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.engine.evaluation import batches, evaluate
from {{ cookiecutter.package_name }}.engine.loop import loss_fn
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.gpt import GPT


def test_evaluation_of_a_language_model_is_the_mean_loss_per_token():
    """model=gpt: val/loss is the mean cross-entropy over every target token (not a sum per sequence divided by
    the sequences), val/acc the share of tokens predicted; the padding sample that keeps the replicas' batch counts
    equal (replica 1 of 2 here: 4 samples and 1 padding sample, in 3 batches as replica 0's 5) counts nowhere.
    A loss of yours (loop.loss_fn changed, here to label smoothing) is the evaluation's loss too."""
    torch.manual_seed(0)
    net = GPT(vocab_size=32, max_seq_len=16, dim=32, depth=2, num_heads=2).eval()
    data = Data(partial(TokenData, vocab_size=32, seq_len=16, val_size=9), batch_size=4)
    loader = data.loader("val", replicas=2, rank=1)
    assert len(loader) == 3
    metrics = evaluate(Accelerator(cpu=True), net, loader, loss_fn)
    x, y = data.splits["val"][1::2]  # replica 1's samples
    with torch.no_grad():
        logits = net(x)
    assert metrics["loss"] == pytest.approx(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item(), abs=1e-6)
    assert metrics["acc"] == pytest.approx((logits.argmax(dim=-1) == y).float().mean().item(), abs=1e-6)

    def smoothed(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, -2), target.flatten(), label_smoothing=0.2)

    expected = smoothed(logits, y).item()
    assert abs(expected - metrics["loss"]) > 0.01, "label smoothing must change the loss"
    assert evaluate(Accelerator(cpu=True), net, loader, smoothed)["loss"] == pytest.approx(expected, abs=1e-6)


def test_evaluation_of_values_is_their_loss_alone():
    """Targets that are values (a regression, loop.loss_fn changed to MSE): val/loss is that loss over every target,
    a real -100.0 too (the eval sampler's padding is NaN there); no accuracy or perplexity, meaningless for values."""
    x, y = torch.randn(5, 3), torch.tensor([[-100.0], [1.0], [2.0], [0.5], [3.0]])
    data = Data(lambda split: TensorDataset(x, y), batch_size=2, splits=["val"])
    net = nn.Linear(3, 1)
    for rank in range(2):  # rank 0: samples 0, 2, 4 (-100.0 among them); rank 1: 1, 3 and a padding sample
        metrics = evaluate(Accelerator(cpu=True), net, data.loader("val", replicas=2, rank=rank), F.mse_loss)
        with torch.no_grad():
            expected = F.mse_loss(net(x[rank::2]), y[rank::2]).item()
        assert metrics == {"loss": pytest.approx(expected, rel=1e-6)}
    # Several values per sample (soft labels, a vector regression): the accuracy compared the output's argmax with
    # the rows of targets, a traceback in the first validation.
    soft = torch.softmax(torch.randn(5, 3), dim=-1)
    net = nn.Linear(3, 3)
    data = Data(lambda split: TensorDataset(x, soft), batch_size=4, splits=["val"])
    metrics = evaluate(Accelerator(cpu=True), net, data.loader("val", replicas=1, rank=0), F.cross_entropy)
    with torch.no_grad():
        assert metrics == {"loss": pytest.approx(F.cross_entropy(net(x), soft).item(), rel=1e-6)}


def test_limit_val_batches_evaluates_that_many_batches_as_lightning_counts_them():
    """trainer.limit_val_batches / limit_test_batches, Lightning's meaning: an int counts batches, a float is a share
    (rounded down: one that leaves none is refused before training, conftest's rows), 0 none, null all. The first
    batch's metrics are the first batch's alone."""
    assert [batches(limit, 10) for limit in (None, 3, 30, 0.25, 0.01, 0.0, 0)] == [10, 3, 10, 2, 0, 0, 0]
    for bad in (-1, 1.5, "all", True):
        with pytest.raises(ConfigError, match="must be a number of batches"):
            check_limit("limit_val_batches", bad)
    torch.manual_seed(0)
    net = GPT(vocab_size=32, max_seq_len=16, dim=32, depth=2, num_heads=2).eval()
    data = Data(partial(TokenData, vocab_size=32, seq_len=16, val_size=12), batch_size=4)
    metrics = evaluate(Accelerator(cpu=True), net, data.loader("val", replicas=1, rank=0), loss_fn, limit=1)
    x, y = data.splits["val"][:4]
    with torch.no_grad():
        first = F.cross_entropy(net(x).flatten(0, 1), y.flatten()).item()
    assert metrics["loss"] == pytest.approx(first, abs=1e-6)


@pytest.mark.slow
def test_default_training_learns_and_logs_offline_to_wandb(train):
    run = train("trainer.accelerator=cpu", as_baked=True)  # (the project's default preset)
    wandb = run.wandb
    assert wandb.metric("val/acc")[-1] >= 0.8, "chance is 1/8: the model must learn the task"
    assert len(wandb.metric("val/loss")) == 3 and len(wandb.metric("test/acc")) == 1
    steps = wandb.steps("train/loss")
    assert steps == list(range(9, 96, 10)), "every log_every_n_steps=10 optimizer steps, as Lightning logs"
    assert wandb.group == "default" and wandb.exit_code == 0
    assert wandb.config["data"]["batch_size"] == 256 and wandb.config["run"]["engine"] == "accelerate"
    assert "wandb sync" in run.output and (run.run_dir / "config.yaml").is_file()
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1].keys() >= {"test/acc", "epoch"} and rows[-1]["epoch"] == 3, "as Lightning's test row"
    # On the console, as Lightning's: a progress bar of the optimizer steps, then the test metrics' table.
    assert "Training: 100%" in run.output and " 96/96 [" in run.output
    assert re.search(rf"│ test/acc +│ {wandb.metric('test/acc')[-1]:.6g} +│", run.output), "the table, as logged"

    # The last checkpoint reloads on its own and reproduces the last logged validation loss.
    model = load_trained(run.run_dir / "checkpoints" / "last")
    dataset = {key: value for key, value in wandb.config["data"]["dataset"].items() if not key.startswith("_")}
    x, y = SyntheticData("val", **dataset).tensors  # the validation split the run built
    with torch.no_grad():
        assert F.cross_entropy(model(x), y).item() == pytest.approx(wandb.metric("val/loss")[-1], abs=1e-5)


# Each preset saves its state its own way: accelerate's files (ddp), one gathered state per stage (pipeline),
# every process's shards of the net and optimizer (model_parallel, torch.distributed.checkpoint).
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ddp", "pipeline", "model_parallel"])
def test_resume_continues_where_the_run_stopped(train, preset):
    """Stop at step 5 of 10, resume from checkpoints/last: the losses after the stop equal an uninterrupted run's.
    A constant learning rate: a schedule spans trainer.max_steps, which this test changes between the runs."""
    common = [*QUICK, "data.shuffle=true", "data.batch_size=64", "trainer.accelerator=cpu", f"strategy={preset}"]
    common += ["scheduler=constant", "trainer.enable_progress_bar=true"]  # (QUICK turns the bar off)
    whole = train(*common, "trainer.max_steps=10", launcher=accelerate_launch()).losses(10)
    first = train(*common, "trainer.max_steps=5", launcher=accelerate_launch())
    last = first.run_dir / "checkpoints" / "last"
    rest = train(*common, "trainer.max_steps=10", f"ckpt_path={last}", launcher=accelerate_launch())
    assert rest.wandb.steps("train/loss") == list(range(5, 10))
    assert rest.wandb.config["trainer"]["devices"] == 2, "the launcher's processes, not the preset's default 1"
    assert " 5/10 [" in rest.output, "the progress bar starts where the run stopped"
    assert rest.losses(5) == pytest.approx(whole[5:], abs=1e-5)
    # Whatever the preset, the checkpoint reloads on one device for evaluation.
    assert sum(p.numel() for p in load_trained(last).parameters()) > 0
    if preset == "model_parallel":  # sharded: each of the 2 processes wrote its own part, none the whole net
        assert sorted(path.name for path in (last / "sharded").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
        assert sorted(path.name for path in last.glob("custom_checkpoint_*.pkl")) == [
            "custom_checkpoint_0.pkl",  # the loop's progress
            "custom_checkpoint_1.pkl",  # the learning-rate schedule
        ]


# ddp_spawn: the crash happens in a process the command started itself.
@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", [["strategy=single"], ["strategy=ddp_spawn", "trainer.devices=2"]], ids=["single", "spawn"]
)
def test_a_failing_run_still_closes_its_wandb_run(train, layout):
    run = train(*QUICK, *layout, "trainer.accelerator=cpu", "model.net._target_=nets.FailingNet", check=False)
    assert run.returncode == 1 and "FailingNet: simulated crash" in run.output
    assert run.wandb.exit_code == 1, "the run is closed, and marked failed"
    if layout[0] == "strategy=ddp_spawn":  # the crashed process's traceback, then one line; not the launcher's
        assert run.output.rstrip().splitlines()[-1].startswith("error: training process ")
        assert run.output.rstrip().endswith("failed: RuntimeError: FailingNet: simulated crash (traceback above)")
        assert "ChildFailedError" not in run.output


def test_a_multirun_of_in_process_trainings_with_other_precisions_trains_each_job(train, tmp_path):
    """accelerate's state is the process's: a --multirun sweep over trainer.precision (its jobs one after another in
    one process) trained its first job, then ended with accelerate's "already been initialized" traceback."""
    sweep = ["hydra.mode=MULTIRUN", "trainer.precision=32-true,bf16-mixed", "trainer.accelerator=cpu"]
    run = train(*sweep, "trainer.max_steps=2", "test_after_fit=false", "run_id=precisions")
    [folder] = (tmp_path / "outputs" / "default").iterdir()
    assert all((folder / job / "finished").is_file() for job in ("0", "1")), run.output[-3000:]
