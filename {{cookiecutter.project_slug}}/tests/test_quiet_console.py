"""A training's console holds what the user needs: no warning and no tip, from the template or the libraries below it,
in the default training (with its test after fit), a resumed run, one started from its checkpoint, ddp (started as
the README says), ddp_spawn (the GPT, with its test after fit, which is logged after the last step), pipeline and a
torchrun launch. wandb speaks (WANDB_SILENT unset). The default training starts a new interpreter, as a user's does;
the others are forks of the tests' helper that has imported the training (tests/forked.py: CI time), whose console is
what that helper printed while importing (a fork does not print a warning on import again) and what the fork prints
after."""

import re

import pytest
from conftest import PACKAGE, QUICK
from engine_specific import DDP, launcher_of
from forked import import_output
from layouts import torchrun

pytestmark = pytest.mark.slow

# A warning from Python's warnings (file.py:12: SomeWarning: ..., and the source line after it; Lightning's have no
# category: file.py:12: ...), a logger's or wandb's WARNING, a tip, a deprecation.
WARNING_LINE = re.compile(r"\.py:\d+: |^\s*warnings\.warn\(|\bWARNING\b|\bTip:|[Dd]eprecat", re.MULTILINE)
SMALL = ["data.train_size=512", "data.val_size=256", "data.test_size=256", "trainer.accelerator=cpu"]
AS_A_USER = {"WANDB_SILENT": None}
NEW_INTERPRETER = {**AS_A_USER, "STARTS_NEW_INTERPRETER": "1"}
SPAWN = ["strategy=ddp_spawn", "trainer.devices=2", "trainer.limit_train_batches=4"]  # stopped at 3 of its 4 steps


def assert_quiet(output: str) -> None:
    lines = [line for line in output.splitlines() if WARNING_LINE.search(line)]
    assert not lines, "\n".join(lines)


def test_the_default_training_and_its_resumption_print_no_warning(train, tmp_path, train_env):
    run_dir = tmp_path / "default"
    first = train(
        *SMALL, "trainer.max_epochs=1", "trainer.log_every_n_steps=1", run_dir=run_dir, env=NEW_INTERPRETER
    )  # tested after fit, as by default
    assert "test/acc" in first.output
    assert_quiet(first.output)
    # The bar's last frame: where the training ended, with its last logged loss (Lightning's showed wandb's run id)
    frames = [frame for frame in re.split(r"[\r\n]", first.output) if re.search(r"\b2/2\b.*loss=\d", frame)]
    assert frames and "v_num" not in first.output, first.output[-3000:]
    resumed = train(*SMALL, "trainer.max_epochs=2", run_dir=run_dir, env=AS_A_USER)  # its checkpoints are there
    assert "resuming from" in resumed.output
    assert_quiet(import_output(f"{PACKAGE}.train", train_env) + resumed.output)
    # started from that checkpoint in a run folder of its own (Lightning: "The dirpath has changed ..."), given as
    # the run folder (its last checkpoint, as load_trained takes it)
    last = next((run_dir / "checkpoints").glob("last*"))
    started = train(*SMALL, "trainer.max_epochs=3", f"ckpt_path={run_dir}", "test_after_fit=false", env=AS_A_USER)
    assert f"starting from {last.resolve()} (ckpt_path)" in started.output
    assert_quiet(import_output(f"{PACKAGE}.train", train_env) + started.output)


@pytest.mark.parametrize(
    "name, overrides, launcher",
    [
        ("ddp", DDP, launcher_of("ddp", 2)),
        ("ddp_spawn-gpt", [*SPAWN, "model=gpt", "data=tokens", "test_after_fit=true"], None),
        ("pipeline", ["strategy=pipeline", "trainer.devices=2"], launcher_of("pipeline", 2)),
        ("ddp-torchrun", DDP, torchrun(2)),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_multi_process_trainings_print_no_warning(train, train_env, name, overrides, launcher):
    run = train(*SMALL, *QUICK, "trainer.max_steps=3", *overrides, launcher=launcher, env=AS_A_USER)
    assert_quiet(import_output(f"{PACKAGE}.train", train_env) + run.output)
    if overrides[: len(SPAWN)] == SPAWN:  # (one ddp_spawn training for both checks: CI time)
        # ddp_spawn fits in processes of its own, whose step count the command's process never saw: Lightning's test
        # pass was logged at step 0; stopped by trainer.max_steps inside its epoch, at step 2 (the checkpoint it reads
        # them from counts its step undone). It is logged after the training's last step, in the epoch after it, as
        # single's.
        assert run.wandb.steps("train/loss") == [0, 1, 2] and run.wandb.steps("test/loss") == [3]
        assert run.wandb.metric("epoch")[-1] == 1, "the test's epoch, after the one epoch trained"
