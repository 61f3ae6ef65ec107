"""The OOM toolkit (`oom=toolkit`) on CPU, with OOMs simulated deterministically (tests/oom_sim.py).

Each training checks several things at once: they are the expensive part.
"""

import ctypes
import os
import warnings
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import QUICK, make_runner
from oom_sim import OOMClassifier
from simulated_oom import simulated_oom
from test_config import compose_config
from test_optimization import expected_cosine
from torch.multiprocessing.spawn import ProcessRaisedException

from {{ cookiecutter.package_name }}.data.synthetic import data_settings
from {{ cookiecutter.package_name }}.engine.callbacks.batch_size_finder import BatchSizeFinder
from {{ cookiecutter.package_name }}.engine.callbacks.item_logger import ItemMetricLogger
from {{ cookiecutter.package_name }}.engine.callbacks.oom_recovery import OOMRecovery, OutOfMemoryStop
from {{ cookiecutter.package_name }}.engine.checkpoints import ResumeCheckpoint
from {{ cookiecutter.package_name }}.engine.datamodule import DataModule
from {{ cookiecutter.package_name }}.engine.module import Classifier
from {{ cookiecutter.package_name }}.engine.training import build_callbacks
from {{ cookiecutter.package_name }}.errors import TrainingStopped, spawned_failure
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.runtime.memory import is_oom_error, rss_mb, search
from {{ cookiecutter.package_name }}.runtime.optimization import cosine

STEPS = 6
BASE = [
    *QUICK,
    f"trainer.max_steps={STEPS}",
    "trainer.accelerator=cpu",
    "data.shuffle=false",
    "data.batch_size=64",
    "+model._target_=oom_sim.OOMClassifier",
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


def test_the_toolkit_turns_on_its_parts_each_by_its_own_key_and_not_the_batch_growing_finder(tmp_path):
    def added(*overrides: str) -> set[str]:
        return {type(callback).__name__ for callback in build_callbacks(compose_config(tmp_path, *overrides))} - base

    base = {type(callback).__name__ for callback in build_callbacks(compose_config(tmp_path))}
    assert added("oom=toolkit") == {"OOMRecovery", "ItemMetricLogger", "DeviceMemoryMonitor"}
    assert added("oom=toolkit", "oom.log_loss_mean=false", "oom.recovery=null") == {"DeviceMemoryMonitor"}
    assert added("oom.find_batch_size=true") == {"BatchSizeFinder"}
    [recovery] = [c for c in build_callbacks(compose_config(tmp_path, "oom=toolkit", "oom.recovery.policy=skip"))
                  if isinstance(c, OOMRecovery)]  # fmt: skip
    assert (recovery.policy, recovery.max_consecutive) == ("skip", 3)


# --- in this process, one device: the recovery's memory of a split, backward OOMs, its failure count -----------


class StepLosses(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def fit_in_process(
    tmp_path,
    *callbacks: L.Callback,
    steps: int = 6,
    train_size: int | None = None,
    save=False,
    resume=None,
    dropout: float = 0.0,
    accumulate: int = 1,
    **oom,
) -> list:
    """Per-step losses of a small single-device training whose module simulates OOMs as `oom` says. `save`: save
    `tmp_path`/last.ckpt as a training does (every 3 steps); `resume`: start from that checkpoint."""
    torch.manual_seed(0)
    losses = StepLosses()
    saving = [ResumeCheckpoint(dirpath=str(tmp_path), every_n_steps=3)] if save or resume else []
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        callbacks=[*callbacks, losses, *saving],
        default_root_dir=tmp_path,
        enable_checkpointing=bool(saving),
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accumulate_grad_batches=accumulate,
    )
    net = ResidualMLP(32, 8, hidden=16, depth=2, dropout=dropout)
    model = OOMClassifier(net, optimizer=partial(torch.optim.SGD, lr=0.5), **oom)
    datamodule = DataModule(**data_settings(batch_size=64, train_size=train_size or 64 * 6, shuffle=False))
    trainer.fit(model, datamodule=datamodule, ckpt_path=resume)
    return losses.losses


@pytest.fixture(scope="module")
def losses_without_oom(tmp_path_factory):
    return fit_in_process(tmp_path_factory.mktemp("no-oom"))


def test_recovery_keeps_the_micro_batch_size_that_worked(tmp_path, losses_without_oom):
    """Every batch of 64 is too big: one OOM, then every step runs 2 micro-batches of 32 (not one OOM per step)."""
    recovery = OOMRecovery()
    assert fit_in_process(tmp_path, recovery, oom_above=32) == pytest.approx(losses_without_oom, abs=1e-5)
    assert (recovery.events, recovery.micro_batch_size) == (1, 32)


def test_recovery_catches_an_oom_in_the_backward(tmp_path, losses_without_oom):
    recovery = OOMRecovery()
    assert fit_in_process(tmp_path, recovery, oom_in_backward_above=16) == pytest.approx(losses_without_oom, abs=1e-5)
    assert (recovery.events, recovery.micro_batch_size) == (2, 16)


def test_a_redone_step_draws_the_random_numbers_of_its_first_try(tmp_path):
    """With random noise on the inputs (as dropout): an OOM in the backward, after the forward drew its noise,
    trains exactly as an OOM in the forward, before any was drawn: the redone step starts from the same random
    state."""
    in_forward = fit_in_process(tmp_path, OOMRecovery(), steps=3, oom_above=32, noise=0.5)
    in_backward = fit_in_process(tmp_path, OOMRecovery(), steps=3, oom_in_backward_above=32, noise=0.5)
    assert in_backward == in_forward


def test_the_micro_batch_size_survives_a_checkpoint(tmp_path, losses_without_oom):
    """3 steps that find micro-batches of 32, a checkpoint, then steps 3-5 resumed from it: they start from 32,
    with the same losses. A recovery that forgot it would run out of memory once more, which max_consecutive=1
    turns into a stop."""
    first, resumed = OOMRecovery(), OOMRecovery(max_consecutive=1)
    before = fit_in_process(tmp_path / "first", first, steps=3, save=True, oom_above=32)
    assert torch.load(tmp_path / "first" / "last.ckpt", weights_only=False)["callbacks"]["OOMRecovery"] == {
        "micro_batch_size": 32,
        "events": 1,
    }
    after = fit_in_process(tmp_path / "resumed", resumed, resume=tmp_path / "first" / "last.ckpt", oom_above=32)
    assert before + after == pytest.approx(losses_without_oom, abs=1e-5)
    assert (resumed.events, resumed.micro_batch_size) == (1, 32)


def test_a_resumed_training_draws_the_random_numbers_of_the_uninterrupted_one(tmp_path):
    """With dropout, stopped mid-epoch after 3 steps and resumed: the losses of the training without the stop, exactly.
    The checkpoint holds the random state (dropout's masks would otherwise come from the seed again)."""
    uninterrupted = fit_in_process(tmp_path / "whole", dropout=0.5)
    before = fit_in_process(tmp_path / "first", steps=3, save=True, dropout=0.5)
    after = fit_in_process(tmp_path / "resumed", resume=tmp_path / "first" / "last.ckpt", dropout=0.5)
    assert before + after == uninterrupted


def test_a_step_that_works_resets_the_failure_count(tmp_path):
    """OOMs at batches 1 and 3, a working split in between: never two in a row, so no stop at max_consecutive=2."""
    recovery = OOMRecovery(max_consecutive=2)
    fit_in_process(tmp_path, recovery, oom_limits={1: 32, 3: 16})
    assert (recovery.events, recovery.consecutive, recovery.micro_batch_size) == (2, 0, 16)
    with pytest.raises(OutOfMemoryStop, match="2 out-of-memory errors in a row at step 1"):
        fit_in_process(tmp_path, OOMRecovery(max_consecutive=2), oom_limits={1: 1})


def test_finder_says_it_changes_the_optimisation_and_stays_within_the_training_split(tmp_path, caplog):
    """Nothing runs out of memory: the finder would grow to max_batch_size, but 200 samples cap the global batch."""
    with caplog.at_level("INFO"):
        fit_in_process(tmp_path, BatchSizeFinder(margin=0.0), steps=1, train_size=200)
    assert "global batch 64 -> 200 (x3.12): this changes the optimisation" in caplog.text


class MicroBatches(L.Callback):
    """Each training forward's batch size, and the global batch the data module then has."""

    def __init__(self):
        self.sizes, self.global_batch_size = [], None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.sizes.append(len(batch[0]))
        self.global_batch_size = trainer.datamodule.batch_size


def test_the_finder_sizes_the_micro_batch_under_gradient_accumulation(tmp_path):
    """trainer.accumulate_grad_batches=2, forwards above 40 samples out of memory: a trial is one micro-batch, so
    each forward then gets the largest that fitted, and the global batch is twice it. (The finder sized the global
    batch as if there were no accumulation: each forward got half of what fits, or a batch 2 does not divide.)"""
    micro = MicroBatches()
    finder = BatchSizeFinder(margin=0.0, tolerance=0.05, steps_per_trial=1)
    fit_in_process(tmp_path, finder, micro, steps=2, oom_above=40, accumulate=2)
    [fitted] = set(micro.sizes)
    assert 38 <= fitted <= 40, "the largest micro-batch that fits, within the search's tolerance"
    assert micro.global_batch_size == 2 * fitted


class LearningRates(L.Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.values.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_the_schedule_spans_the_steps_of_the_batch_the_finder_found(tmp_path):
    """The finder grows the global batch 64 -> 128, so the epoch of 640 samples is 5 optimizer steps, not 10: the
    cosine schedule spans those 5 (warmup 2), from the learning rate lr_scaling=linear doubled, decay included."""
    learning_rates = LearningRates()
    finder = BatchSizeFinder(max_batch_size=128, margin=0.0, lr_scaling="linear")
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        callbacks=[finder, learning_rates],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    schedule = partial(cosine, warmup_steps=2, min_lr_ratio=0.1)
    model = Classifier(ResidualMLP(32, 8, hidden=16, depth=2), partial(torch.optim.SGD, lr=0.1), scheduler=schedule)
    trainer.fit(model, datamodule=DataModule(**data_settings(batch_size=64, train_size=640, shuffle=False)))
    assert learning_rates.values == pytest.approx([expected_cosine(step, 0.2, 2, 5, 0.1) for step in range(5)])


class BatchSizeAtStart(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.batch_size = trainer.datamodule.batch_size


def test_a_resumed_training_keeps_the_batch_the_finder_found(tmp_path):
    """Batches above 32 run out of memory: the finder settles on 32. Resumed with all the memory free, the training
    keeps 32 (saved in the checkpoint) instead of searching again, which would now grow it to the split's 384."""
    found, resumed = BatchSizeAtStart(), BatchSizeAtStart()
    finder = partial(BatchSizeFinder, margin=0.0, tolerance=0.5, steps_per_trial=1)  # 3 trials: 64, 32, 48
    fit_in_process(tmp_path / "first", finder(), found, steps=3, save=True, oom_above=32)
    assert found.batch_size == 32
    fit_in_process(tmp_path / "resumed", finder(), resumed, resume=tmp_path / "first" / "last.ckpt")
    assert resumed.batch_size == 32


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
    """One rank (the last) runs out of memory on batch 2: every rank halves its micro-batch and redoes the step,
    and later steps keep that size; the finder's trials leave no trace."""
    replicas = 2 if layout == "ddp" else 1
    run = make_runner(tmp_path, oom_env)(
        *BASE,
        *LAYOUTS[layout],
        "oom=toolkit",
        "oom.find_batch_size=true",
        "+model.oom_batches=[2]",
        f"+model.oom_rank={replicas - 1}",
        f"oom.batch_size_finder.max_batch_size={64 // replicas}",  # finds the configured batch again
        "oom.batch_size_finder.margin=0",
        timeout=240,
    )
    wandb = run.wandb
    assert wandb.metric("batch_size_finder/per_device_batch_size") == [64 // replicas]
    assert wandb.metric("batch_size_finder/trials") == [1]
    assert wandb.metric("oom/events") == [1] and wandb.steps("oom/events") == [2]
    # Logged by rank 0, which never ran out of memory, yet halved its micro-batches with the rank that did.
    assert wandb.metric("oom/micro_batch_size") == [64 // replicas // 2]
    assert "OOMRecovery: out of memory at step 2" in run.output
    assert f"OOMRecovery: micro-batches of {64 // replicas // 2} fit" in run.output
    # Same losses as a run with neither the finder's trials nor the OOM: weights, optimizer state and
    # the split step are exactly restored / equivalent (differences are float summation order only).
    assert wandb.steps("train/loss") == list(range(STEPS))
    assert run.losses(STEPS) == pytest.approx(reference_losses, abs=1e-5)
    assert wandb.metric("train/loss_mean") == pytest.approx(reference_losses, abs=1e-5)  # item logger, every step
    # Per-device memory, every rank, logged by rank 0.
    for rank in range(replicas):
        assert wandb.metric(f"memory/rank{rank}/rss_mb")[0] > 50
    assert wandb.metric("memory/imbalance")[0] >= 1.0


def oom_stop() -> OutOfMemoryStop:
    stop = OutOfMemoryStop(3, 5, "skip", "oom.recovery.policy")
    stop.checkpoint = "outputs/default/1/checkpoints/oom-stop.ckpt"
    return stop


def _stop(rank: int) -> None:
    raise oom_stop()


def test_a_stop_in_a_process_ddp_spawn_started_reaches_the_user_as_the_same_one_line():
    """strategy=ddp_spawn: the stop is raised in a process the command started, which hands the command its
    traceback as text (torch's ProcessRaisedException); the command raises the stop again from it, to print as its
    one line. (A spawned process's crash, whose traceback is printed: test_train.py. The stop in a real training,
    under ddp's same processes: test_finder_then_skip_then_a_clean_stop.)"""
    with pytest.raises(ProcessRaisedException) as spawned:
        torch.multiprocessing.start_processes(_stop, nprocs=1, start_method="fork")
    reported = spawned_failure(spawned.value.error_index, str(spawned.value))
    assert type(reported) is TrainingStopped and str(reported) == str(oom_stop())


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_finder_then_skip_then_a_clean_stop(tmp_path, oom_env, layout):
    """The finder finds a threshold that only the last rank has; a skipped batch is survived;
    three OOMs in a row stop the run with a message and a checkpoint, without hanging."""
    replicas = 1 if layout == "single" else 2
    threshold = 40
    run = make_runner(tmp_path, oom_env)(
        *BASE,
        *LAYOUTS.get(layout, [f"strategy={layout}", "trainer.devices=2"]),
        "oom=toolkit",
        "oom.find_batch_size=true",
        "oom.recovery.policy=skip",
        f"+model.oom_above={threshold}",
        "+model.oom_batches=[1,3,4,5]",
        f"+model.oom_rank={replicas - 1}",
        check=False,
        timeout=240,
    )
    assert run.returncode == 1 and "Traceback" not in run.output
    # One line, what to try, where the state is (every rank stops alike: ddp's other rank may say it too).
    stop = "error: 3 out-of-memory errors in a row at step 5 (policy skip): the step does not fit in memory; lower "
    stop += "data.batch_size, or oom.recovery.policy=split (the same batch in smaller micro-batches); "
    assert {line for line in run.output.splitlines() if line.startswith("error:")} == {
        stop + f"checkpoint saved to {run.run_dir / 'checkpoints' / 'oom-stop.ckpt'}"
    }
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
        if len(self.rss) == 3:
            # Before the baseline, the heap's free pages go back to the system: what is kept from now on then grows
            # the process. (In a test worker that ran other tests first, freed heap took it without growing: flaky.)
            ctypes.CDLL("libc.so.6").malloc_trim(0)
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


@pytest.mark.slow
def test_the_finder_counts_the_gradients_lightning_holds_through_the_next_forward(train):
    """A memory model of the device (simulated_oom.GradientsHeldMLP): a forward of B samples needs B units, 100 more
    while the step before's gradients are still held, which Lightning's loop does until the backward; 300 in all.
    The finder's trials run in that order, so it settles near 200 and the training runs. (Its trials freed the
    gradients after each step: it settled near 300 x 0.9, and the training's second step ran out of memory.)"""
    model = ["model.net._target_=simulated_oom.GradientsHeldMLP", "+model.net.budget=300"]
    finder = ["oom.find_batch_size=true", "trainer.accelerator=cpu", "trainer.max_steps=3"]
    run = train(*QUICK, *finder, *model, "+model.net.gradient_units=100")
    [largest] = run.wandb.metric("batch_size_finder/largest_fitting")
    assert 190 <= largest <= 200, "the largest batch whose second step, gradients held, fits"
    assert run.wandb.steps("train/loss") == [0, 1, 2]
