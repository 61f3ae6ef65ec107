"""The OOM toolkit (`callbacks=oom`) on CPU, with OOMs simulated deterministically (tests/oom_sim.py).

Each training checks several things at once: they are the expensive part.
"""

import os
import warnings
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import QUICK, make_runner
from hydra.utils import instantiate
from oom_sim import simulated_oom
from test_config import compose_config

from {{ cookiecutter.package_name }}.callbacks.item_logger import ItemMetricLogger
from {{ cookiecutter.package_name }}.datamodule import DataModule
from {{ cookiecutter.package_name }}.memory import is_oom_error, rss_mb, search
from {{ cookiecutter.package_name }}.model import ResidualMLP
from {{ cookiecutter.package_name }}.module import Classifier
from {{ cookiecutter.package_name }}.synthetic import data_settings

STEPS = 6
BASE = [
    *QUICK,
    f"trainer.max_steps={STEPS}",
    "trainer.accelerator=cpu",
    "data.shuffle=false",
    "data.batch_size=64",
    "model._target_=oom_sim.OOMClassifier",
]
LAYOUTS = {"single": ["strategy=single"], "ddp": ["strategy=ddp", "trainer.devices=2"]}


# --- detection and search: no training ----------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("no message a matcher would know"),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a ..."),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried"),
    ],
)
def test_oom_is_recognised_by_type_or_message(error):
    assert is_oom_error(error)


def test_other_errors_are_not_oom():
    assert not is_oom_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom_error(ValueError("CUDA out of memory"))  # not an allocator's error type


@pytest.mark.parametrize("threshold", [1, 7, 100, 1000, 3000])
@pytest.mark.parametrize("start", [1, 64, 4096])
def test_search_finds_the_largest_size_that_fits(threshold, start):
    tried = []
    size, trials = search(lambda n: tried.append(n) or n <= threshold, start, maximum=4096, tolerance=0.05)
    assert 0.95 * threshold <= size <= threshold
    assert trials == len(tried) <= 20


def test_search_respects_the_maximum_and_reports_nothing_fits():
    assert search(lambda n: True, 64, maximum=100)[0] == 100
    assert search(lambda n: False, 64, maximum=100)[0] == 0


def test_oom_preset_turns_on_every_part_of_the_toolkit(tmp_path):
    cfg = compose_config(tmp_path, "callbacks=oom", "~callbacks.item_logger")
    assert set(cfg.callbacks) == {
        *("checkpoint", "last_checkpoint", "progress_bar"),
        *("batch_size_finder", "oom_recovery", "device_memory"),
    }
    callbacks = [instantiate(node) for node in cfg.callbacks.values()]
    assert len(callbacks) == 6
    alone = compose_config(tmp_path, "callbacks=[default,oom_recovery]")
    assert set(alone.callbacks) == {"checkpoint", "last_checkpoint", "progress_bar", "oom_recovery"}


# --- real trainings ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oom_env(train_env):
    """Training subprocesses must import oom_sim from this folder."""
    env = dict(train_env)
    env["PYTHONPATH"] = os.pathsep.join((str(Path(__file__).parent), env["PYTHONPATH"]))
    return env


@pytest.fixture(scope="module")
def reference_losses(tmp_path_factory, oom_env):
    run = make_runner(tmp_path_factory.mktemp("reference"), oom_env)(*BASE, "strategy=single")
    return run.losses(STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_survives_an_oom_with_the_losses_of_a_run_without(tmp_path, oom_env, reference_losses, layout):
    """One rank runs out of memory on batch 2: every rank splits it; the finder's trials leave no trace."""
    replicas = 2 if layout == "ddp" else 1
    run = make_runner(tmp_path, oom_env)(
        *BASE,
        *LAYOUTS[layout],
        "callbacks=oom",
        "+model.oom_batches=[2]",
        f"+model.oom_rank={replicas - 1}",
        f"callbacks.batch_size_finder.max_batch_size={64 // replicas}",  # finds the configured batch again
        "callbacks.batch_size_finder.margin=0",
        timeout=240,
    )
    wandb = run.wandb
    assert wandb.metric("batch_size_finder/per_device_batch_size") == [64 // replicas]
    assert wandb.metric("batch_size_finder/trials") == [1]
    assert wandb.metric("oom/events") == [1] and wandb.steps("oom/events") == [2]
    assert wandb.metric("oom/parts") == [1]
    assert "OOMRecovery: out of memory at step 2" in run.output
    # Same losses as a run with neither the finder's trials nor the OOM: weights, optimizer state and
    # the split step are exactly restored / equivalent (differences are float summation order only).
    assert wandb.steps("train/loss") == list(range(STEPS))
    assert run.losses(STEPS) == pytest.approx(reference_losses, abs=1e-5)
    assert wandb.metric("train/loss_mean") == pytest.approx(reference_losses, abs=1e-5)  # item logger, every step
    # Per-device memory, every rank, logged by rank 0.
    for rank in range(replicas):
        assert wandb.metric(f"memory/rank{rank}/rss_mb")[0] > 50
    assert wandb.metric("memory/imbalance")[0] >= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_finder_then_skip_then_a_clean_stop(tmp_path, oom_env, layout):
    """The finder finds a threshold that only the last rank has; a skipped batch is survived;
    three OOMs in a row stop the run with a message and a checkpoint, without hanging."""
    replicas = 2 if layout == "ddp" else 1
    threshold = 40
    run = make_runner(tmp_path, oom_env)(
        *BASE,
        *LAYOUTS[layout],
        "callbacks=oom",
        "callbacks.oom_recovery.policy=skip",
        f"+model.oom_above={threshold}",
        "+model.oom_batches=[1,3,4,5]",
        f"+model.oom_rank={replicas - 1}",
        check=False,
        timeout=240,
    )
    assert run.returncode != 0
    assert "3 out-of-memory errors in a row at step 5 (policy skip)" in run.output
    assert (run.run_dir / "checkpoints" / "oom-stop.ckpt").is_file()
    wandb = run.wandb
    [largest] = wandb.metric("batch_size_finder/largest_fitting")
    assert 0.95 * threshold <= largest <= threshold
    assert wandb.metric("batch_size_finder/per_device_batch_size") == [int(largest * 0.9)]
    assert wandb.metric("batch_size_finder/global_batch_size") == [int(largest * 0.9) * replicas]
    assert "BatchSizeFinder: largest per-device batch that fits" in run.output
    # Batch 1 skipped, batch 2 trained (step 2), then the stop. The item logger logs trained steps only
    # (Lightning re-logs the previous train/loss on a skipped step).
    assert wandb.steps("train/loss_mean") == [0, 2]
    assert wandb.metric("oom/events") == [1, 2, 3, 4] and wandb.steps("oom/events") == [1, 3, 4, 5]
    assert wandb.exit_code != 0


# --- the .item() logger: memory and host syncs, in this process (single device) -------------------


class ReturnsGraph(Classifier):
    """Returns, for logging, a metric from a second forward pass that is not trained on, and forgets
    .detach(): its graph, never freed by a backward, holds that pass's activations (about 10 MiB here)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        noisy_confidence = self(x + 0.1 * torch.randn_like(x)).softmax(-1).amax(-1).mean()
        return {"loss": torch.nn.functional.cross_entropy(self(x), y), "noisy_confidence": noisy_confidence}


class KeepOutputs(L.Callback):
    """The naive logger: keeps every step's tensor to average it later."""

    def __init__(self):
        self.kept = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.kept.append(outputs["noisy_confidence"])


class RSSProbe(L.Callback):
    def __init__(self):
        self.rss = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rss.append(rss_mb())


def fit_and_measure(logger_callback: L.Callback, steps: int = 20) -> float:
    """MiB the process grew by between step 4 and the last step."""
    torch.manual_seed(0)
    probe = RSSProbe()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        log_every_n_steps=5,
        logger=False,
        callbacks=[logger_callback, probe],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    net = ResidualMLP(32, 8, hidden=32, depth=4, expansion=16)  # wide activations, few FLOPs: quick on CPU
    model = ReturnsGraph(net, optimizer=partial(torch.optim.SGD, lr=0.01))
    trainer.fit(model, datamodule=DataModule(**data_settings(batch_size=512, train_size=512 * (steps + 1))))
    return probe.rss[-1] - probe.rss[3]


@pytest.mark.slow
def test_item_logger_keeps_memory_flat_where_keeping_tensors_grows_it():
    naive = fit_and_measure(KeepOutputs())
    item_logger = ItemMetricLogger()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flat = fit_and_measure(item_logger)
    print(f"RSS growth over 16 steps: keeping tensors {naive:.0f} MiB, item logger {flat:.0f} MiB")
    assert naive > 80, "each kept tensor holds its step's activations"
    assert flat < naive / 4
    assert item_logger.host_syncs == 4, "steps 5, 10, 15, 20: one host sync per logging step"
    graph_warnings = [w for w in caught if "autograd graph" in str(w.message)]
    assert len(graph_warnings) == 1, "warns once, not every step"


def test_simulated_oom_is_what_cuda_raises():
    assert isinstance(simulated_oom(), torch.OutOfMemoryError) and is_oom_error(simulated_oom())
