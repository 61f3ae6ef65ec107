"""Real trainings on CPU: the default run learns, logs one wandb run, checkpoints, reloads and resumes."""

import pytest
import torch
import torch.nn.functional as F
from conftest import QUICK

from {{ cookiecutter.package_name }}.data.synthetic import SyntheticData
from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained

pytestmark = pytest.mark.slow


def test_default_training_learns_and_logs_offline_to_wandb(train, tmp_path):
    # The documented default run, as a user without a wandb account starts it: no WANDB_MODE, no credentials.
    no_account = {"WANDB_MODE": None, "WANDB_API_KEY": None, "NETRC": str(tmp_path / "no-netrc")}
    run = train(env=no_account, as_baked=True)
    wandb = run.wandb  # exactly one run, written offline because there are no credentials
    assert wandb.metric("val/acc")[-1] >= 0.8, "chance is 1/8; the README promises about 0.85"
    assert wandb.metric("test/acc"), "test runs after fit by default"
    assert wandb.metric("val/loss")[-1] < wandb.metric("val/loss")[0]
    losses = wandb.metric("train/loss")
    assert wandb.steps("train/loss") == list(range(9, 96, 10)), "train/loss is logged at the global step"
    assert losses[-1] < losses[0]
    assert wandb.group == "default"
    assert wandb.config["data"]["batch_size"] == 256 and "batch_size" not in wandb.config
    assert wandb.config["run"]["strategy_preset"] == "{{ cookiecutter.default_strategy }}"
    if wandb.config["run"]["strategy_preset"] in ("ddp", "ddp_spawn"):  # a project baked with one as its default
        assert "note: strategy=ddp" in run.output and "runs 1 process here" in run.output  # CPU: devices=auto is 1
    assert wandb.exit_code == 0
    assert "wandb sync" in run.output
    assert (run.run_dir / "config.yaml").is_file()

    # The last checkpoint reloads on its own and reproduces the last logged validation loss.
    model = load_trained(run.run_dir / "checkpoints" / "last.ckpt")
    dataset = {key: value for key, value in wandb.config["data"]["dataset"].items() if not key.startswith("_")}
    x, y = SyntheticData("val", **dataset).tensors  # the validation split the run built
    with torch.no_grad():
        assert F.cross_entropy(model(x), y).item() == pytest.approx(wandb.metric("val/loss")[-1], abs=1e-5)


def test_resume_continues_the_global_step(train):
    first = train(*QUICK, "trainer.max_epochs=3", "trainer.max_steps=8", "logger=none")
    assert not (first.run_dir / "wandb").exists(), "logger=none must not start wandb"
    checkpoint = first.run_dir / "checkpoints" / "last.ckpt"
    resumed = train(*QUICK, "trainer.max_epochs=3", "trainer.max_steps=12", f"ckpt_path={checkpoint}")
    assert resumed.wandb.steps("train/loss") == [8, 9, 10, 11]


def test_callbacks_none_still_resumes_and_no_checkpointing_saves_none(train, tmp_path):
    """The checkpoint a restart resumes from was an entry of configs/callbacks/: callbacks=none trained every restart
    from scratch, saying nothing; trainer.enable_checkpointing=false stopped with Lightning's error instead."""
    run_dir = tmp_path / "bare"
    train(*QUICK, "callbacks=none", "trainer.max_steps=4", "logger=none", run_dir=run_dir)
    again = train(*QUICK, "callbacks=none", "trainer.max_steps=6", run_dir=run_dir)
    assert "resuming from" in again.output and again.wandb.steps("train/loss") == [4, 5]
    unsaved = train(*QUICK, "trainer.enable_checkpointing=false", "trainer.max_steps=2", "logger=none")
    assert not (unsaved.run_dir / "checkpoints").exists() and (unsaved.run_dir / "finished").is_file()


def test_fast_dev_run_logs_nothing_as_lightning_says(train):
    """Lightning's smoke test of one batch per split says it logs nothing; the project's wandb logger, set after the
    Trainer was built, replaced its DummyLogger and logged a wandb run and a metrics file anyway."""
    run = train(*QUICK, "+trainer.fast_dev_run=true")
    assert "Running in `fast_dev_run` mode" in run.output and run.returncode == 0
    assert not (run.run_dir / "wandb").exists() and not (run.run_dir / "metrics.jsonl").exists()


# ddp_spawn: the crash happens in a process the command started itself.
@pytest.mark.parametrize(
    "layout", [["strategy=single"], ["strategy=ddp_spawn", "trainer.devices=2"]], ids=["single", "spawn"]
)
def test_a_failing_run_still_closes_its_wandb_run(train, layout):
    run = train(*QUICK, *layout, "+callbacks.fail._target_=failing_callback.FailAtStep", check=False)
    assert run.returncode == 1 and "failing on purpose at step 3" in run.output
    assert run.wandb.exit_code == 1, "wandb.finish(exit_code=1) must run when training fails"
    assert run.wandb.steps("train/loss") == [0, 1, 2]
    if layout[0] == "strategy=ddp_spawn":  # the crashed process's traceback, then one line; not the launcher's
        assert run.output.rstrip().endswith("failed: RuntimeError: failing on purpose at step 3 (traceback above)")
        assert "ProcessRaisedException" not in run.output


def test_the_schedule_spans_the_steps_limit_train_batches_lets_run(train):
    """trainer.limit_train_batches=4 of an epoch of 10 batches: the cosine schedule spans the 4 optimizer steps that
    run, not the 10 of a whole epoch (it ended far above its floor)."""
    from test_optimization import expected_cosine

    limits = ["trainer.limit_train_batches=4", "data.train_size=640", "data.batch_size=64", "trainer.accelerator=cpu"]
    schedule = ["model.optimizer.lr=0.01", "scheduler=cosine", "scheduler.warmup_steps=0", "scheduler.min_lr_ratio=0.1"]
    run = train(*QUICK, *limits, *schedule)
    assert run.wandb.steps("train/lr") == [0, 1, 2, 3]
    expected = [expected_cosine(step, 0.01, 0, 4, 0.1) for step in range(4)]
    assert run.wandb.metric("train/lr") == pytest.approx(expected, rel=1e-6)
