"""strategy=dp: steps run on replicas, the loss is the batch mean, logs are written once by the root.

nn.DataParallel needs GPUs to scatter, replicate and gather; `ChunkedDataParallel` below does the same
on CPU so the strategy's own logic is tested here. The last test runs real steps on 2 GPUs.
"""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import QUICK
from lightning.fabric.utilities.apply_func import apply_to_collection
from torch import Tensor, nn

from {{ cookiecutter.package_name }}.data.synthetic import data_settings
from {{ cookiecutter.package_name }}.engine.datamodule import DataModule
from {{ cookiecutter.package_name }}.engine.module import Classifier
from {{ cookiecutter.package_name }}.engine.strategies import data_parallel_size
from {{ cookiecutter.package_name }}.engine.strategies.dp import (
    DataParallelStrategy,
    PerReplica,
    ReplicaLogs,
    ReplicaSteps,
    reduce_gathered,
)
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP

pytestmark = pytest.mark.filterwarnings("ignore:strategy=dp replicates")


class Recorded(Classifier):
    """A small Classifier whose `log` records calls (replicas share the list: a copy's __dict__ is shallow)."""

    def __init__(self) -> None:
        super().__init__(ResidualMLP(8, 4, hidden=16, depth=2, expansion=2), torch.optim.SGD)
        self.logged: list[tuple[str, float, dict]] = []

    def log(self, name: str, value: Tensor, **options) -> None:
        self.logged.append((name, float(value), options))


def gather(outputs: list):
    """torch.nn.parallel.gather without GPUs: concatenate replicas' tensors along dim 0."""
    first = outputs[0]
    if isinstance(first, Tensor):
        return torch.cat(outputs)
    if isinstance(first, dict):
        return {key: gather([output[key] for output in outputs]) for key in first}
    if isinstance(first, PerReplica):
        return PerReplica(*map(gather, zip(*outputs, strict=True)))
    return first  # None


class ChunkedDataParallel(nn.Module):
    """nn.DataParallel's scatter -> replicate -> apply -> gather, on CPU and one replica after the other."""

    def __init__(self, steps: ReplicaSteps, replicas: int) -> None:
        super().__init__()
        self.steps, self.replicas = steps, replicas

    def forward(self, *inputs):
        outputs = []
        for index in range(self.replicas):
            chunk = apply_to_collection(inputs, Tensor, lambda t, i=index: t.chunk(self.replicas)[i])
            replica = self.steps._replicate_for_data_parallel()
            replica.module = self.steps.module._replicate_for_data_parallel()
            outputs.append(replica(*chunk))
        return gather(outputs)


def dp_strategy(model: L.LightningModule, replicas: int) -> DataParallelStrategy:
    strategy = DataParallelStrategy(parallel_devices=[torch.device("cpu")])
    strategy.connect(model)
    strategy.model = ChunkedDataParallel(ReplicaSteps(model), replicas)
    return strategy


@pytest.mark.parametrize("batch_size, replicas", [(64, 2), (10, 3)], ids=["even", "uneven-4-4-2"])
def test_replicas_compute_the_full_batch_step_and_log_it_once(batch_size, replicas):
    torch.manual_seed(0)
    model = Recorded()
    x, y = torch.randn(batch_size, 8), torch.randint(0, 4, (batch_size,))
    expected = F.cross_entropy(model(x), y)
    expected.backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    strategy = dp_strategy(model, replicas)
    loss = strategy.training_step((x, y), 0)
    loss.backward()  # through the reduction and the gather, as Lightning's backward does

    assert loss.shape == () and loss.item() == pytest.approx(expected.item(), abs=1e-6)
    for grad, expected_grad in zip([p.grad for p in model.parameters()], expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)
    assert model.logged == [], "train/loss is logged by on_train_batch_end, on the root, from the reduced loss"

    with torch.no_grad():
        totals = strategy.validation_step((x, y), 0)  # a row per replica, added up on the root at the batch's end
        logits = model(x)
    assert model.logged == [], "validation is summed per target and logged once, at the epoch's end"
    loss_sum, correct, count = totals.reshape(-1, 3).sum(dim=0).tolist()
    assert count == batch_size and correct == (logits.argmax(-1) == y).sum().item()
    assert loss_sum / count == pytest.approx(F.cross_entropy(logits, y).item(), abs=1e-6)


def test_gathered_scalars_become_batch_means_and_per_sample_outputs_stay_concatenated():
    logits = torch.randn(4, 3)
    output = {"loss": PerReplica(torch.tensor([1.0, 4.0]), torch.tensor([3.0, 1.0])), "logits": logits}
    reduced = reduce_gathered(output)
    assert reduced["loss"].item() == pytest.approx((1.0 * 3 + 4.0 * 1) / 4)
    assert reduced["logits"] is logits
    assert reduce_gathered(None) is None


def test_replica_logs_reduce_as_self_log_asks():
    logs = ReplicaLogs()
    for samples, value in ((3, 2.0), (1, 6.0)):
        log = logs.recorder(samples)
        log("mean", torch.tensor(value))
        log("count", value, reduce_fx="sum", batch_size=samples)
    reduced = {name: (value.item(), options) for name, value, options in logs.reduced(torch.device("cpu"))}
    assert reduced["mean"] == (pytest.approx((2.0 * 3 + 6.0 * 1) / 4), {})
    assert reduced["count"] == (8.0, {"reduce_fx": "sum", "batch_size": 4})


def test_fewer_than_two_gpus_warns_and_runs_on_one_device():
    with pytest.warns(UserWarning, match="strategy=dp replicates over 2 or more GPUs, got 2 CPU") as warned:
        trainer = L.Trainer(strategy=DataParallelStrategy(), accelerator="cpu", devices=2, logger=False)
    # Only ours: Lightning's own "srun is available" hint appears where SLURM is installed (the template's CI).
    assert len([w for w in warned if "strategy=dp" in str(w.message)]) == 1
    assert trainer.num_devices == 1 and trainer.world_size == 1
    assert data_parallel_size(trainer) == 1, "one process loads the whole global batch"
    datamodule = DataModule(**data_settings(batch_size=64))
    datamodule.trainer = trainer
    assert datamodule.per_device_batch_size == 64


class OwnTransfer(Recorded):
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch


class ManualOptimization(Recorded):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class Compiled(Recorded):
    def __init__(self) -> None:
        super().__init__()
        self.compile_net = True  # compile=true


@pytest.mark.parametrize(
    "model, message",
    [
        (OwnTransfer, "cannot call OwnTransfer.transfer_batch_to_device: nn.DataParallel moves the batch"),
        (ManualOptimization, "needs automatic optimization"),
        (Compiled, "does not support compile=true: nn.DataParallel copies the net into a thread per GPU"),
    ],
)
def test_what_cannot_work_on_replicas_fails_at_start(tmp_path, model, message):
    trainer = L.Trainer(strategy=DataParallelStrategy(), accelerator="cpu", max_epochs=1, default_root_dir=tmp_path)
    with pytest.raises(ConfigError, match=f"^strategy=dp {message}"):
        trainer.fit(model(), datamodule=DataModule(**data_settings()))
    assert trainer.global_step == 0


@pytest.mark.slow
def test_dp_trains_logs_once_and_saves_checkpoints_a_single_device_model_loads(train):
    run = train(*QUICK, "strategy=dp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_steps=3")
    assert run.output.count("strategy=dp replicates over 2 or more GPUs") == 1
    assert run.wandb.steps("train/loss") == [0, 1, 2], "logged once per step"
    assert run.wandb.config["run"]["devices"] == 1 and run.wandb.config["run"]["per_device_batch_size"] == 256
    state = torch.load(run.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert state and all(key.startswith("net.") for key in state), "no nn.DataParallel 'module.' prefix"
    Classifier(ResidualMLP(32, 8), torch.optim.AdamW).load_state_dict(state)  # strict


class DeviceRecorded(Classifier):
    """Records, from inside each replica, the device it believes it is on and the device of its chunk."""

    def __init__(self) -> None:
        super().__init__(ResidualMLP(32, 8), torch.optim.SGD)
        self.seen: list[tuple[torch.device, torch.device]] = []
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.device, batch[0].device))
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


@pytest.mark.gpu(2)  # nn.DataParallel replicates only over 2 or more GPUs
@pytest.mark.slow
def test_real_steps_on_two_gpus_match_one_gpu(tmp_path):
    def fit(strategy, devices: int) -> DeviceRecorded:
        torch.manual_seed(0)
        model = DeviceRecorded()
        options = dict(max_steps=3, limit_val_batches=2, logger=False, enable_checkpointing=False)
        trainer = L.Trainer(accelerator="gpu", devices=devices, strategy=strategy, default_root_dir=tmp_path, **options)
        trainer.fit(model, datamodule=DataModule(**data_settings(batch_size=64, shuffle=False)))
        assert trainer.num_devices == devices
        return model

    single, dp = fit("auto", 1), fit(DataParallelStrategy(), 2)
    assert {seen for seen, _ in dp.seen} == {torch.device("cuda", 0), torch.device("cuda", 1)}
    assert all(seen == batch_device for seen, batch_device in dp.seen), "self.device is the replica's device"
    assert dp.losses == pytest.approx(single.losses, abs=1e-4)
