"""train/loss is averaged over the processes only on the steps Lightning writes to the loggers; the .item()
logger (callbacks/item_logger.py) writes on those same steps."""

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger

from {{ cookiecutter.package_name }}.data.synthetic import data_settings
from {{ cookiecutter.package_name }}.engine.callbacks.item_logger import ItemMetricLogger
from {{ cookiecutter.package_name }}.engine.datamodule import DataModule
from {{ cookiecutter.package_name }}.engine.module import Classifier
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP


class Recorder(Logger):
    """Keeps the train/loss values the trainer writes, and the steps of the item logger's means."""

    name, version = "recorder", 0

    def __init__(self) -> None:
        super().__init__()
        self.losses: dict[int, float] = {}
        self.means: dict[int, float] = {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if "train/loss" in metrics:
            self.losses[step] = metrics["train/loss"]
        if "train/loss_mean" in metrics:
            self.means[step] = metrics["train/loss_mean"]

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


class Spied(Classifier):
    """Records each step's loss and the steps at which train/loss was logged, each after its all-reduce (under
    several processes; this test runs one, where the strategy skips it)."""

    def __init__(self) -> None:
        super().__init__(ResidualMLP(32, 8, hidden=16, depth=1), torch.optim.SGD)
        self.losses: dict[int, float] = {}
        self.synced: list[int] = []

    def log(self, name: str, value, **options) -> None:
        if name == "train/loss":
            self.synced.append(self.trainer.fit_loop.epoch_loop._batches_that_stepped)
        super().log(name, value, **options)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # Accumulated batches: Lightning divides each loss by their number, so their sum is the step's loss.
        step = self.trainer.fit_loop.epoch_loop._batches_that_stepped
        self.losses[step] = self.losses.get(step, 0.0) + outputs["loss"].item()
        super().on_train_batch_end(outputs, batch, batch_idx)


class StopAt(L.Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trainer.should_stop = batch_idx == self.batch


@pytest.mark.parametrize(
    "options, written",
    [
        (dict(log_every_n_steps=3), [2, 5, 8]),
        (dict(log_every_n_steps=2, accumulate_grad_batches=2), [1, 3]),  # 10 batches, 5 optimizer steps
        (dict(log_every_n_steps=3, callbacks=[StopAt(batch=3)]), [2, 3]),  # the step that stops is written
        (dict(log_every_n_steps=0), []),
    ],
    ids=["every-3", "accumulate", "should-stop", "never"],
)
def test_train_loss_is_synced_only_on_the_steps_written(tmp_path, options, written):
    model, recorder, item_logger = Spied(), Recorder(), ItemMetricLogger()
    options["callbacks"] = [*options.get("callbacks", []), item_logger]
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=10,
        limit_val_batches=0,
        logger=recorder,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **options,
    )
    trainer.fit(model, datamodule=DataModule(**data_settings(batch_size=8, seed=0)))
    assert sorted(recorder.losses) == written
    assert model.synced == written, "one sync per written step, none in between"
    assert recorder.losses == pytest.approx({step: model.losses[step] for step in written})
    assert sorted(recorder.means) == written and item_logger.host_syncs == len(written), "the item logger too"
    # train/loss_mean: the mean of the optimizer steps' losses since the last log (accumulated ones: whole steps')
    since = [-1, *written]
    expected = {
        step: sum(model.losses[s] for s in range(since[i] + 1, step + 1)) / (step - since[i])
        for i, step in enumerate(written)
    }
    assert recorder.means == pytest.approx(expected)


def test_tf32_is_set_by_the_modules_setup_which_every_process_runs():
    """tf32 is set in LightningModule.setup, which Lightning calls in every training process: ddp_spawn's
    processes do not inherit the setting of the process that starts them."""
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        Classifier(ResidualMLP(32, 8, hidden=16, depth=1), torch.optim.SGD, tf32=False).setup("fit")
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)
        torch.backends.cudnn.allow_tf32 = True


def test_one_process_validation_leaves_padding_targets_out(tmp_path):
    """Token targets padded with -100 by a collate (sequences of different lengths): one process counted the padding
    as wrong tokens (val/acc 0.077 where it was 0.122) and weighed each batch's mean by its samples, not its tokens.
    The metrics now equal the sums over the real targets, as several processes compute them."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 5, 4), torch.randint(0, 3, (6, 5))
    y[:4, 3:] = -100  # the first batch's sequences are shorter: 3 of its 5 positions are padding
    module = Classifier(net=torch.nn.Linear(4, 3), optimizer=torch.optim.SGD)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    [metrics] = trainer.validate(module, dataloaders=loader, verbose=False)
    with torch.no_grad():
        logits = module.net(x)
    real = y != -100
    expected_loss = torch.nn.functional.cross_entropy(logits[real], y[real]).item()
    expected_acc = (logits.argmax(dim=-1)[real] == y[real]).float().mean().item()
    assert metrics["val/loss"] == pytest.approx(expected_loss, rel=1e-6)
    assert metrics["val/acc"] == pytest.approx(expected_acc, rel=1e-6)


class SoftLabels(Classifier):
    """Soft labels (a row of class probabilities per sample) with a loss of the user's, as the refusal of float
    targets for cross-entropy suggests."""

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, target)


def test_validation_of_soft_labels_logs_their_loss_alone(tmp_path):
    """Float targets of several values per sample (soft labels, a vector regression): the accuracy compared the
    output's argmax with the rows of targets, a traceback in the first validation once the run folder was made."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 4), torch.softmax(torch.randn(6, 3), dim=-1)
    module = SoftLabels(net=torch.nn.Linear(4, 3), optimizer=torch.optim.SGD)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)  # batches of 4, then 2
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    [metrics] = trainer.validate(module, dataloaders=loader, verbose=False)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(module.net(x), y).item()
    assert metrics == {"val/loss": pytest.approx(expected, rel=1e-6)}
