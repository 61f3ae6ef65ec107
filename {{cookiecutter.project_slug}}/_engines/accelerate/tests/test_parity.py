"""Loss parity: every preset computes what one device computes, launched the way the README says.

Same seed, same data order (data.shuffle=false), same GLOBAL batch: the first K train/loss values logged to
wandb must equal strategy=single's within TOLERANCE (differences come only from the order of floating-point
sums, ~1e-7 on CPU). The Lightning engine's single run gives the same values too: the template's tests
compare the two engines.
"""

import pytest
from conftest import PARITY, TOLERANCE, K
from launchers import accelerate_launch, torchrun

pytestmark = pytest.mark.slow


# (name, overrides, launcher): one row per preset and launch mode.
CASES = [
    ("ddp-accelerate-launch", ["strategy=ddp"], accelerate_launch),
    ("ddp-torchrun", ["strategy=ddp"], torchrun),
    ("ddp_spawn", ["strategy=ddp_spawn", "trainer.devices=2"], None),
    ("dp", ["strategy=dp", "trainer.devices=2"], None),  # on CPU: one device, through the same code
    ("model_parallel-tp2", ["strategy=model_parallel"], accelerate_launch),
    ("model_parallel-layers", ["strategy=model_parallel", "strategy.mode=layers", "strategy.devices=[cpu,cpu]"], None),
    ("pipeline-gpipe", ["strategy=pipeline", "strategy.schedule=gpipe"], accelerate_launch),
    ("pipeline-1f1b", ["strategy=pipeline", "strategy.schedule=1f1b"], torchrun),
]


@pytest.mark.parametrize("name, overrides, launcher", CASES, ids=[case[0] for case in CASES])
def test_first_losses_equal_single_device(train, single_losses, name, overrides, launcher):
    run = train(*PARITY, *overrides, launcher=launcher() if launcher else None)
    assert run.wandb.steps("train/loss")[:K] == list(range(K))
    assert run.losses(K) == pytest.approx(single_losses, abs=TOLERANCE), name
    assert run.wandb.config["run"]["world_size"] == (2 if launcher or "ddp_spawn" in overrides[0] else 1)


def test_shuffled_runs_match_too(train, single_losses):
    """data.shuffle=true: the seeded sampler deals the same samples to each global batch on any layout."""
    shuffled = [*(o for o in PARITY if o != "data.shuffle=false"), "data.shuffle=true"]
    single = train(*shuffled, "strategy=single").losses(K)
    assert single != pytest.approx(single_losses, abs=TOLERANCE), "shuffling must change the batches"
    assert train(*shuffled, "strategy=ddp", launcher=accelerate_launch()).losses(K) == pytest.approx(
        single, abs=TOLERANCE
    )
