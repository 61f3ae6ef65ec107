"""Loss parity of what one layout cannot show: shuffled data, accumulated micro-batches with clipping.

Same seed, same data order (data.shuffle=false), same GLOBAL batch: the first K train/loss values logged to
wandb must equal strategy=single's within TOLERANCE (differences come only from the order of floating-point
sums, ~1e-7 on CPU). Every layout against single, in every precision, is test_presets.py's table. The Lightning
engine's single run gives the same values too: the template's tests compare the two engines.
"""

import pytest
import torch
from conftest import PARITY, TOLERANCE, K
from launchers import accelerate_launch, torchrun_elastic
from layouts import command, layout
from restarts import losses_by_step

from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.parallel.pipelining import bubble_fraction

pytestmark = pytest.mark.slow


def test_a_pipeline_logging_every_few_steps_logs_the_batch_loss(train, single_losses):
    """Only the logged steps bring the last stage's loss to every stage, with the stages' idle shares: those
    steps log single's losses (the mean over the processes), the others nothing. With the OOM toolkit's
    train/loss_mean: the mean of the steps since the last log, the last stage's (the others have no loss then)."""
    overrides, launcher = command(layout("pipeline-gpipe"))
    toolkit = ["oom=toolkit", "oom.recovery=null"]  # (the pipeline's micro-batches are its own OOM recovery)
    wandb = train(*PARITY, *overrides, *toolkit, "trainer.log_every_n_steps=3", launcher=launcher).wandb
    assert wandb.steps("train/loss") == wandb.steps("pipeline/idle_fraction/stage1") == [2, 5]
    assert wandb.metric("train/loss") == pytest.approx([single_losses[2], single_losses[5]], abs=TOLERANCE)
    assert wandb.steps("train/loss_mean") == [2, 5]
    means = [sum(single_losses[:3]) / 3, sum(single_losses[3:6]) / 3]
    assert wandb.metric("train/loss_mean") == pytest.approx(means, abs=TOLERANCE)
    # how it is pipelined, in the config as the Lightning engine logs it
    summary = wandb.config["pipeline"]
    counts, microbatches = summary.pop("parameters_per_stage"), summary["microbatches"]
    assert summary == {
        **{"stages": 2, "stages_per_process": 1, "pipelines": 1, "tensor_parallel_size": 1, "schedule": "gpipe"},
        **{"microbatches": microbatches, "bubble_fraction": round(bubble_fraction(2, microbatches, "gpipe"), 4)},
    }
    assert len(counts) == 2 and min(counts) > 0, counts


def test_a_pipeline_killed_while_saving_resumes_each_stage_from_its_own_part(train, single_losses, tmp_path):
    """The 1f1b schedule under torchrun, killed while writing the checkpoint of step 6: torchrun restarts the stages,
    each reads its own part of the checkpoint of step 3 in place (nothing was gathered on one process), and they
    train on as one device does."""
    killed_at_step_6 = [
        "model.optimizer._target_=nets.AdamWKilledWhileSaving",
        "+model.optimizer.kill_at_step=6",
        f"+model.optimizer.marker={tmp_path / 'killed'}",
    ]
    restarts = torchrun_elastic(2, max_restarts=1)
    fresh_stores = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # as launch/torchrun_multinode.sh
    run = train(*PARITY, "strategy=pipeline", "checkpoint.every_n_steps=3", *killed_at_step_6, launcher=restarts,
                env=fresh_stores)  # fmt: skip
    assert (tmp_path / "killed").exists() and "resuming from" in run.output and "step-0000003" in run.output
    assert losses_by_step(run.run_dir) == pytest.approx(dict(enumerate(single_losses)), abs=TOLERANCE)


def test_shuffled_runs_match_too(train, single_losses):
    """data.shuffle=true: the seeded sampler deals the same samples to each global batch on any layout. The ddp run
    is typed as in the Lightning engine, without a launcher: the command starts its 2 processes under torchrun."""
    shuffled = [*(o for o in PARITY if o != "data.shuffle=false"), "data.shuffle=true"]
    single = train(*shuffled, "strategy=single").losses(K)
    assert single != pytest.approx(single_losses, abs=TOLERANCE), "shuffling must change the batches"
    ddp = train(*shuffled, "strategy=ddp", "trainer.devices=2")
    assert ddp.losses(K) == pytest.approx(single, abs=TOLERANCE)
    assert ddp.wandb.config["run"]["world_size"] == 2 and ddp.wandb.starts == 1


# Plain SGD, so that clipping changes the update in proportion (Adam's update hardly depends on the scale).
SGD = ["model.optimizer._target_=torch.optim.SGD", "model.optimizer.lr=0.1", "trainer.gradient_clip_val=0.05"]


def test_accumulated_half_batches_train_like_the_whole_batch(train):
    """data.batch_size stays the global batch: as two accumulated half batches it is one whole batch, so on every
    layout the logged losses and the clipped weights after K optimizer steps equal single's at the whole batch.
    Under ddp the first half skips the gradient all-reduce (no_sync); under model_parallel the clip must use the
    norm of the whole gradient, not of each shard."""
    whole_batch = [*PARITY, *SGD]
    whole = train(*whole_batch, "strategy=single")
    expected = weights(whole)
    unclipped = weights(train(*(o for o in whole_batch if "clip" not in o), "strategy=single"))
    assert not all(torch.allclose(expected[name], unclipped[name], atol=1e-4) for name in expected), "no clipping"
    by_value = weights(train(*whole_batch, "trainer.gradient_clip_algorithm=value", "strategy=single"))
    for other in (unclipped, expected):  # each element to +-0.05: neither the norm's clip nor none (it was refused)
        assert not all(torch.allclose(by_value[name], other[name], atol=1e-4) for name in expected)

    halves = [*whole_batch, "trainer.accumulate_grad_batches=2"]
    for overrides, launcher in [(["strategy=single"], None), (["strategy=ddp"], accelerate_launch()),
                                (["strategy=model_parallel"], accelerate_launch())]:  # fmt: skip
        run = train(*halves, *overrides, launcher=launcher)
        assert run.wandb.steps("train/loss") == list(range(K)), "logged once per optimizer step"
        assert run.losses(K) == pytest.approx(whole.losses(K), abs=TOLERANCE), f"{overrides[0]}: the batch's loss"
        got = weights(run)
        for name, value in expected.items():
            assert torch.allclose(got[name], value, atol=TOLERANCE), f"{overrides[0]}: {name} differs"


def weights(run) -> dict[str, torch.Tensor]:
    return load_trained(run.run_dir / "checkpoints" / "last").state_dict()


ON_GPU = [*(o for o in PARITY if o != "trainer.accelerator=cpu"), "trainer.accelerator=auto"]


@pytest.mark.gpu(2)  # ddp_spawn forks one process per GPU
def test_ddp_spawn_on_two_gpus_with_precision_auto(train):
    """trainer.precision=auto is decided in the process that forks the others without initialising CUDA there
    (NVML): a forked process cannot use CUDA once its parent has initialised it."""
    run = train(*ON_GPU, "strategy=ddp_spawn", "trainer.devices=2")
    oldest = min(torch.cuda.get_device_capability(index) for index in range(torch.cuda.device_count()))
    assert run.wandb.config["trainer"]["precision"] == ("bf16-mixed" if oldest >= (8, 0) else "32-true")
