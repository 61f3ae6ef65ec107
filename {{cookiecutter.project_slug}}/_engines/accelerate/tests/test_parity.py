"""Loss parity: every preset computes what one device computes, launched the way the README says.

Same seed, same data order (data.shuffle=false), same GLOBAL batch: the first K train/loss values logged to
wandb must equal strategy=single's within TOLERANCE (differences come only from the order of floating-point
sums, ~1e-7 on CPU). The Lightning engine's single run gives the same values too: the template's tests
compare the two engines.
"""

from functools import partial

import pytest
import torch
from conftest import PARITY, TOLERANCE, K
from launchers import accelerate_launch, torchrun, torchrun_elastic
from restarts import losses_by_step

from {{ cookiecutter.package_name }}.checkpoints import load_trained

pytestmark = pytest.mark.slow


DP2_TP2 = ["strategy=model_parallel", "strategy.data_parallel_size=2", "strategy.tensor_parallel_size=2"]
LAYERS = ["strategy=model_parallel", "strategy.mode=layers", "strategy.devices=[cpu,cpu]"]

# (name, overrides, launcher, processes): one row per preset and launch mode.
CASES = [
    ("ddp-accelerate-launch", ["strategy=ddp"], accelerate_launch, 2),
    ("ddp-torchrun", ["strategy=ddp"], torchrun, 2),
    ("ddp_spawn", ["strategy=ddp_spawn", "trainer.devices=2"], None, 2),
    ("dp", ["strategy=dp", "trainer.devices=2"], None, 1),  # on CPU: one device, through the same code
    ("model_parallel-tp2", ["strategy=model_parallel"], accelerate_launch, 2),
    ("model_parallel-dp2xtp2", DP2_TP2, partial(accelerate_launch, 4), 4),
    ("model_parallel-layers", LAYERS, None, 1),
    ("pipeline-gpipe", ["strategy=pipeline", "strategy.schedule=gpipe"], accelerate_launch, 2),
]  # and pipeline's 1f1b schedule under torchrun, killed and restarted, below


@pytest.mark.parametrize("name, overrides, launcher, processes", CASES, ids=[case[0] for case in CASES])
def test_first_losses_equal_single_device(train, single_losses, name, overrides, launcher, processes):
    run = train(*PARITY, *overrides, launcher=launcher() if launcher else None)
    assert run.wandb.steps("train/loss")[:K] == list(range(K))
    assert run.losses(K) == pytest.approx(single_losses, abs=TOLERANCE), name
    assert run.wandb.config["run"]["world_size"] == processes


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
    """data.shuffle=true: the seeded sampler deals the same samples to each global batch on any layout."""
    shuffled = [*(o for o in PARITY if o != "data.shuffle=false"), "data.shuffle=true"]
    single = train(*shuffled, "strategy=single").losses(K)
    assert single != pytest.approx(single_losses, abs=TOLERANCE), "shuffling must change the batches"
    assert train(*shuffled, "strategy=ddp", launcher=accelerate_launch()).losses(K) == pytest.approx(
        single, abs=TOLERANCE
    )


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


def test_bf16_mixed_precision_runs_under_autocast(train, single_losses):
    """trainer.precision=bf16-mixed: accelerate's autocast (on the CPU here, CUDA's on a GPU). Close to the
    fp32 losses, and not equal to them: the forward really ran in bf16."""
    losses = train(*PARITY, "strategy=single", "trainer.precision=bf16-mixed").losses(K)
    assert losses == pytest.approx(single_losses, abs=2e-2)
    assert losses != pytest.approx(single_losses, abs=1e-5), "bf16 must change the arithmetic"


ON_GPU = [*(o for o in PARITY if o != "trainer.accelerator=cpu"), "trainer.accelerator=auto"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed with its gradient scaler is tested on a CUDA GPU")
def test_fp16_mixed_precision_on_gpu_stays_close_to_fp32(train, single_losses):
    run = train(*ON_GPU, "strategy=single", "trainer.precision=16-mixed")
    assert run.losses(K) == pytest.approx(single_losses, abs=2e-2)
    assert run.wandb.config["trainer"]["precision"] == "16-mixed"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nn.DataParallel replicates only over 2 or more GPUs")
def test_dp_over_two_gpus_matches_single(train, single_losses):
    run = train(*ON_GPU, "strategy=dp", "trainer.devices=2")
    assert run.losses(K) == pytest.approx(single_losses, abs=1e-4)  # GPU against CPU arithmetic
    assert run.wandb.config["run"]["replica_devices"] == 2
