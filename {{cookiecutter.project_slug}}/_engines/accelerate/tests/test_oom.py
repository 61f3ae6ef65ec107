"""The OOM toolkit (`oom=toolkit`) on CPU, with out-of-memory errors simulated by tests/nets.py."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from conftest import PARITY, QUICK, TOLERANCE, K, make_runner
from launchers import accelerate_launch
from nets import OOMNet
from restarts import losses_by_step, run_in
from simulated_oom import simulated_oom
from test_optimization import expected_cosine

from {{ cookiecutter.package_name }}.data.loading import Data
from {{ cookiecutter.package_name }}.data.synthetic import data_settings
from {{ cookiecutter.package_name }}.engine.oom.batch_size_finder import find_batch_size
from {{ cookiecutter.package_name }}.engine.oom.recovery import OOMRecovery
from {{ cookiecutter.package_name }}.engine.strategies import Strategy
from {{ cookiecutter.package_name }}.runtime.memory import OutOfMemoryStop

OOM = [*QUICK, "trainer.accelerator=cpu", "oom=toolkit", "model.net._target_=nets.OOMNet", "data.batch_size=128"]
FINDER = [*OOM, "oom.find_batch_size=true"]


# --- the recovery, in this process: its memory of a split, backward OOMs, its failure count -------------------


def train_steps(recovery: dict | None, max_batch: dict[int, int], steps: int = 4, **oom) -> tuple[list, object]:
    """Per-step losses of a few SGD steps on one process, the net running out of memory above max_batch[step]
    (from that step on), trained through OOMRecovery(**recovery), or without it (None)."""
    torch.manual_seed(0)
    accelerator, strategy = Accelerator(cpu=True), Strategy()
    net = OOMNet(32, 8, hidden=16, depth=2, max_batch=64, **oom)
    model, optimizer = strategy.prepare(accelerator, net, partial(torch.optim.SGD, lr=0.5))
    stepper = OOMRecovery(strategy, **recovery) if recovery is not None else None
    losses = []
    for step in range(steps):
        net.max_batch = max_batch.get(step, net.max_batch)
        x, y = torch.randn(64, 32), torch.randint(0, 8, (64,))
        if stepper:
            loss = stepper.train_step(accelerator, model, x, y, F.cross_entropy, step)
        else:
            loss = strategy.train_step(accelerator, model, x, y, F.cross_entropy)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, stepper


@pytest.fixture(scope="module")
def losses_without_oom():
    return train_steps(None, {})[0]


@pytest.mark.parametrize("in_backward", [False, True], ids=["forward", "backward"])
def test_recovery_keeps_the_micro_batch_size_that_worked(losses_without_oom, in_backward):
    """Every batch of 64 is too big, in the forward or in the backward: one OOM, then every step runs 2
    micro-batches of 32 (not one OOM per step), with the losses of a run without OOMs."""
    losses, recovery = train_steps({}, {0: 32}, in_backward=in_backward)
    assert losses == pytest.approx(losses_without_oom, abs=TOLERANCE)
    assert (recovery.events, recovery.micro_batch_size) == (1, 32)


def test_a_redone_step_draws_the_random_numbers_of_its_first_try():
    """With random noise on the inputs (as dropout): an OOM in the backward, after the forward drew its noise,
    trains exactly as an OOM in the forward, before any was drawn: the redone step starts from the same random
    state."""
    in_forward, _ = train_steps({}, {0: 32}, steps=2, noise=0.5)
    in_backward, _ = train_steps({}, {0: 32}, steps=2, noise=0.5, in_backward=True)
    assert in_backward == in_forward


def test_a_step_that_works_resets_the_failure_count():
    """OOMs at steps 1 and 3, a working split in between: never two in a row, so no stop at max_consecutive=2."""
    _, recovery = train_steps({"max_consecutive": 2}, {1: 32, 3: 16})
    assert (recovery.events, recovery.consecutive, recovery.micro_batch_size) == (2, 0, 16)
    with pytest.raises(OutOfMemoryStop, match="2 out-of-memory errors in a row at step 1"):
        train_steps({"max_consecutive": 2}, {1: 0})


class StepOOM(torch.optim.SGD):
    """SGD whose step runs out of memory after a forward of more than `max_batch` samples, as allocating Adam's
    state does on a first step that the batch's activations have left no room for."""

    def __init__(self, params, net: OOMNet, max_batch: int, lr: float = 0.1) -> None:
        super().__init__(params, lr=lr)
        self.net, self.max_batch = net, max_batch

    def step(self, closure=None):
        if self.net.last_batch > self.max_batch:
            raise simulated_oom()
        return super().step(closure)


class BatchRecorded(OOMNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_batch = len(x)
        return super().forward(x)


def test_the_search_counts_an_out_of_memory_error_in_the_optimizer_step():
    """Each trial takes an optimizer step: a batch whose forward and backward fit, but not the step after them,
    does not fit (a search without the step would keep it, and training would run out of memory later)."""
    torch.manual_seed(0)
    accelerator, strategy = Accelerator(cpu=True), Strategy()
    net = BatchRecorded(32, 8, hidden=16, depth=2, max_batch=10**6)  # its forward never runs out of memory
    model, optimizer = strategy.prepare(accelerator, net, partial(StepOOM, net=net, max_batch=100))
    data = Data(**data_settings(batch_size=64, train_size=1024))
    find_batch_size(accelerator, strategy, model, optimizer, data, 1, F.cross_entropy, max_batch_size=512)
    assert data.batch_size == 90, "90% of the largest batch whose step fitted: 100 (bisected to within 5%)"


def test_the_search_sizes_the_micro_batch_under_gradient_accumulation():
    """Two micro-batches per optimizer step, forwards above 100 samples out of memory: a trial is one micro-batch,
    so the global batch is 2 x 90% of the largest that fits (it was 90% of it: each forward got half of that)."""
    torch.manual_seed(0)
    accelerator, strategy = Accelerator(cpu=True), Strategy()
    net = BatchRecorded(32, 8, hidden=16, depth=2, max_batch=100)
    model, optimizer = strategy.prepare(accelerator, net, partial(torch.optim.SGD, lr=0.1))
    data = Data(**data_settings(batch_size=64, train_size=1024))
    find_batch_size(accelerator, strategy, model, optimizer, data, 1, F.cross_entropy, 512, accumulation=2)
    assert data.batch_size % 2 == 0 and 2 * 85 <= data.batch_size <= 2 * 90, data.batch_size


# --- real trainings ----------------------------------------------------------------------------


@pytest.mark.slow
def test_one_rank_out_of_memory_splits_on_every_rank_with_the_losses_of_one_device(train, single_losses):
    """Rank 1 cannot take its 32 samples: both ranks halve their micro-batches, once, redo the step and train on
    as one device would."""
    run = train(*PARITY, "strategy=ddp", "oom=toolkit", "model.net._target_=nets.OOMNet", "+model.net.max_batch=16",
                "+model.net.oom_rank=1", launcher=accelerate_launch())  # fmt: skip
    assert run.losses(K) == pytest.approx(single_losses, abs=TOLERANCE)
    assert run.wandb.metric("oom/events") == [1]
    # Logged by rank 0, which never ran out of memory, yet halved its micro-batches with rank 1.
    assert run.wandb.metric("oom/micro_batch_size") == [16]
    assert "OOMRecovery: micro-batches of 16 fit" in run.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", [["strategy=single"], ["strategy=ddp_spawn", "trainer.devices=2"]], ids=["single", "spawn"]
)
def test_out_of_memory_again_and_again_stops_in_one_line_after_a_checkpoint(train, layout):
    """No micro-batch fits: 128, 64 and 32 samples run out of memory, and the third OOM in a row stops the run.
    ddp_spawn: the stop is raised in the processes this command started, and still reaches the user as one line."""
    run = train(*OOM, *layout, "+model.net.max_batch=0", check=False)
    assert run.returncode == 1 and "Traceback" not in run.output
    checkpoint = (run.run_dir / "checkpoints" / "last").resolve()
    assert [line for line in run.output.splitlines() if line.startswith("error:")] == [
        "error: 3 out-of-memory errors in a row at step 0 (policy split): the step does not fit in memory; lower "
        f"data.batch_size; checkpoint saved to {checkpoint}"
    ]
    assert torch.load(checkpoint / "custom_checkpoint_0.pkl", weights_only=False)["oom_recovery"]["events"] == 3


@pytest.mark.slow
def test_the_micro_batch_size_survives_a_checkpoint(tmp_path, train_env):
    """3 steps that find micro-batches of 32, a checkpoint, then steps 3-5 resumed from it: they start from 32
    (no OOM again, where a recovery that forgot it would run out of memory once more), with the losses of a
    training without OOMs."""
    constant = [*PARITY, "strategy=single", "scheduler=constant"]  # a cosine schedule would span max_steps
    oom = ["oom=toolkit", "model.net._target_=nets.OOMNet", "+model.net.max_batch=32"]
    reference = losses_by_step(make_runner(tmp_path, train_env)(*constant).run_dir)
    run_dir = tmp_path / "run"
    first = run_in(run_dir, train_env, *constant, *oom, "trainer.max_steps=3")
    assert first.returncode == 0, first.stderr[-3000:]
    progress = torch.load(run_dir / "checkpoints" / "last" / "custom_checkpoint_0.pkl", weights_only=False)
    assert progress["oom_recovery"] == {"micro_batch_size": 32, "events": 1}
    resumed = run_in(run_dir, train_env, *constant, *oom)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "out of memory" not in resumed.stdout
    assert "OOMRecovery: micro-batches of 32, as the checkpoint says" in resumed.stdout
    assert losses_by_step(run_dir) == pytest.approx(reference, abs=TOLERANCE)


@pytest.mark.slow
def test_one_rank_out_of_memory_makes_every_rank_shrink(train):
    """Rank 1 cannot take more than 40 samples; rank 0 could. Both must train with 90% of 40 (accelerate's own
    find_executable_batch_size would shrink rank 1 only, and the ranks would then disagree)."""
    one_rank_40 = ["+model.net.max_batch=40", "+model.net.oom_rank=1"]
    sqrt = "oom.batch_size_finder.lr_scaling=sqrt"  # the learning rate scaled with the global batch's root
    # (no validation: the epoch's memory was logged by the validation only)
    run = train(
        *FINDER, "strategy=ddp", *one_rank_40, sqrt, "trainer.limit_val_batches=0", launcher=accelerate_launch()
    )
    wandb = run.wandb
    assert wandb.metric("batch_size_finder/largest_fitting") == [40]
    assert wandb.metric("batch_size_finder/per_device_batch_size") == [36]
    assert wandb.metric("batch_size_finder/global_batch_size") == [72]
    assert "global batch 128 -> 72 (x0.562): this changes the optimisation" in run.output
    assert len(wandb.metric("train/loss")) == 8192 // 72, "an epoch of global batches of 72"
    # The schedule spans those 113 steps (built for batches of 128, it would span 64): cosine.yaml's warmup of 10,
    # from the learning rate lr_scaling=sqrt scaled.
    assert wandb.metric("batch_size_finder/lr_factor") == pytest.approx([(72 / 128) ** 0.5])
    lr = 1e-3 * (72 / 128) ** 0.5
    assert wandb.metric("train/lr") == pytest.approx([expected_cosine(step, lr, 10, 113, 0.1) for step in range(113)])
    # Per-rank memory each epoch, and how uneven it is (with validation turned off too).
    assert len(wandb.metric("memory/rank0/rss_mb")) == len(wandb.metric("memory/rank1/rss_mb")) == 1
    assert wandb.metric("memory/imbalance")[0] >= 1.0


@pytest.mark.slow
def test_the_search_grows_a_batch_that_fits_as_lightnings_does(train):
    """Doubles from 128 until 1024 fails, then bisects to within 5% of 1000; trains with 90% of it. Started again,
    the training resumes with that batch (saved in the checkpoint) and does not search again."""
    run = train(*FINDER, "strategy=single", "+model.net.max_batch=1000", "trainer.max_steps=2")
    [largest] = run.wandb.metric("batch_size_finder/largest_fitting")
    assert 950 <= largest <= 1000
    assert run.wandb.metric("batch_size_finder/global_batch_size") == [int(largest * 0.9)]
    # Stopped by trainer.max_steps inside its first epoch: its memory is logged there, as Lightning's end of epoch does
    assert run.wandb.steps("memory/rank0/rss_mb") == [2] and run.wandb.metric("memory/imbalance") == [1.0]
    again = train(*FINDER, "strategy=single", "+model.net.max_batch=1000", "trainer.max_steps=3", run_dir=run.run_dir)
    assert f"find_batch_size: global batch {int(largest * 0.9)}, found before the restart" in again.output
    assert again.wandb.metric("batch_size_finder/trials") == run.wandb.metric("batch_size_finder/trials"), "once"
    assert again.wandb.steps("train/loss") == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.gpu(1)
def test_a_skipped_step_under_16_mixed_takes_no_optimizer_step(train):
    """oom.recovery.policy=skip with a gradient scaler: a skipped batch leaves no gradient, and its optimizer step
    is left out (the scaler refused it with a traceback: "No inf checks were recorded for this optimizer"). Every
    batch of 128 is skipped here, so the third skip in a row stops the run in its one line."""
    on_gpu = [override for override in OOM if override != "trainer.accelerator=cpu"] + ["trainer.accelerator=gpu"]
    skip = ["oom.recovery.policy=skip", "+model.net.max_batch=64", "trainer.precision=16-mixed"]
    run = train(*on_gpu, "strategy=single", *skip, check=False)
    assert "Traceback" not in run.output and "No inf checks" not in run.output, run.output[-3000:]
    [error] = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert run.returncode == 1 and "3 out-of-memory errors in a row" in error and "(policy skip)" in error
