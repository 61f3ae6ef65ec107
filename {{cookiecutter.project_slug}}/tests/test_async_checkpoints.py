"""checkpoint.async=true: the processes of fsdp, model_parallel and pipeline write their parts of a checkpoint in the
background (torch.distributed.checkpoint's async_save) while training goes on, and `last` moves to a checkpoint
only once it is written. Killed while one is being written, the training continues from the previous one, with the
uninterrupted losses. (The presets that save a whole model from one process refuse it in one line:
test_optimization.py.)"""

import os
from pathlib import Path

import pytest
from conftest import QUICK, TOLERANCE, make_runner
from engine_specific import LAST, kept_checkpoints, launcher_of

pytestmark = pytest.mark.slow

# Shuffled, a checkpoint every 3 steps, 8 steps; a constant learning rate (a schedule spans trainer.max_steps).
SETTINGS = [*QUICK, "trainer.accelerator=cpu", "data.shuffle=true", "data.train_size=512", "data.batch_size=64",
            "checkpoint.every_n_steps=3", "scheduler=constant", "trainer.max_steps=8"]  # fmt: skip
# fsdp and model_parallel write through one strategy's save; pipeline through its own.
PRESETS = {"fsdp": ["strategy=fsdp", "trainer.devices=2"], "pipeline": ["strategy=pipeline", "trainer.devices=2"]}


def step_of(link: Path) -> int:
    """The step of the checkpoint a link points at (step000003.ckpt, step-0000003)."""
    return int("".join(filter(str.isdigit, Path(os.path.realpath(link)).name)))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_kill_while_a_checkpoint_is_written_in_the_background_resumes_from_the_previous(tmp_path, train_env, preset):
    train = make_runner(tmp_path, train_env)
    single = train(*SETTINGS, "strategy=single").losses(8)

    run_dir = tmp_path / "killed"
    # Every process SIGKILLed in step 7's optimizer step, right after the checkpoint of step 6 started to be written
    # (its write is acknowledged at a step's end, never before): `last` must still be step 3's.
    crash = ["model.optimizer._target_=own_models.AdamWKilledOnce", f"+model.optimizer.marker={tmp_path / 'crashed'}",
             "+model.optimizer.at=6", "checkpoint.async=true"]  # fmt: skip
    layout, launcher = PRESETS[preset], launcher_of(preset, 2)
    killed = train(*SETTINGS, *layout, *crash, launcher=launcher, run_dir=run_dir, check=False)
    assert killed.returncode != 0 and (tmp_path / "crashed.0").exists(), killed.output[-3000:]
    assert step_of(run_dir / LAST) == 3, "last moved to a checkpoint whose write had not been acknowledged"
    assert any("0006" in path.name for path in (run_dir / "checkpoints").iterdir()), "step 6's was being written"

    again = train(*SETTINGS, *layout, *crash, launcher=launcher, run_dir=run_dir)  # the same command
    assert "resuming from" in again.output
    assert again.losses(9) == pytest.approx(single, abs=TOLERANCE), "one wandb run, each step once"
    assert step_of(run_dir / LAST) == 8, "the end's checkpoint, written in the background, was waited for"
    assert kept_checkpoints(run_dir)[0] == [8], "checkpoint.keep_last=1: the older ones removed once last moved on"
