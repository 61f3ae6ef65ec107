"""Every private member of Lightning's classes this engine uses, in one place, each with why: Lightning (pinned
<2.7) has no public way to do these. tests/test_lightning_private.py fails loudly when a release renames one.

Overriding `ModelCheckpoint._save_checkpoint` (engine/checkpoints.py: the `last` link moves once every rank has
written) and `ModelCheckpoint._remove_checkpoint` (the keep_last newest stay) are the uses outside this module; they
are listed in PRIVATE_MEMBERS and checked too.
"""

import os
import sys
from datetime import timedelta
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.strategies.launchers import subprocess_script

from ..parallel.launcher import hydra_quoted, this_job

PRIVATE_MEMBERS = {  # what the test checks is still there, and where it is used
    _FitLoop: ("_should_accumulate",),
    _TrainingEpochLoop: ("_batches_that_stepped",),
    ModelCheckpoint: (
        "_every_n_train_steps",
        "_train_time_interval",
        "_should_skip_saving_checkpoint",
        "_save_topk_checkpoint",
        "_monitor_candidates",
        "_last_global_step_saved",
        "_save_checkpoint",
        "_remove_checkpoint",
    ),
    WandbLogger: ("_experiment", "_wandb_init"),
    L.LightningModule: ("_trainer", "_device"),
    subprocess_script: ("_hydra_subprocess_cmd",),
}


def only_accumulates(trainer: L.Trainer) -> bool:
    """Whether this training batch only accumulates gradients (no optimizer step): the fit loop's own test."""
    return trainer.fit_loop._should_accumulate()


def count_steps_in_both_loops(checkpoint: dict[str, Any]) -> None:
    """Make a checkpoint's two optimizer-step counters agree: strategy=pipeline steps by hand (manual optimization)
    and Lightning counts those steps apart from the automatic optimization's of the other presets; global_step (what
    trainer.max_steps stops at) reads the counter of the loop that runs. A run continued under the other kind would
    start counting from 0 and train past trainer.max_steps. The checkpoint's `loops` layout is Lightning's own."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    automatic = loops.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {}).get("step")
    manual = loops.get("epoch_loop.manual_optimization.optim_step_progress")
    if not (automatic and manual):
        return
    for span in ("total", "current"):
        for field in ("ready", "completed"):
            automatic[span][field] = manual[span][field] = max(automatic[span][field], manual[span][field])


def continue_mid_epoch(checkpoint: dict[str, Any]) -> None:
    """A checkpoint an earlier version saved when trainer.max_steps stopped the training before its epoch's last
    batch: saved at the epoch's end, it counts the epoch as done, and the run continued from it skipped the rest of the
    epoch. Its loop counters are put as a checkpoint saved at that step is (engine/checkpoints.py saves one now): the
    epoch's end not yet run, the step's batch not yet counted complete. The `loops` layout is Lightning's own."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs, batches = loops.get("epoch_progress"), loops.get("epoch_loop.batch_progress")
    if not (epochs and batches) or batches.get("is_last_batch", True):
        return
    if epochs["current"]["processed"] <= epochs["current"]["completed"]:
        return  # saved during the epoch, as every checkpoint of this version is
    for span in ("total", "current"):
        epochs[span]["processed"] -= 1
        batches[span]["completed"] -= 1
    if "_batches_that_stepped" in loops.get("epoch_loop.state_dict", {}):
        loops["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1


def count_this_runs_micro_batches(checkpoint: dict[str, Any], samples_per_micro_batch: int) -> None:
    """Count the batches done in a checkpoint's epoch as this run's micro-batches of `samples_per_micro_batch` (over
    all processes). One of another data.batch_size or trainer.accumulate_grad_batches (ckpt_path=) counted its own:
    Lightning ended this run's optimizer steps where that count says (from 1 micro-batch a step to 4 accumulated,
    the first step trained one, with a quarter of the loss) and its epoch where that count runs out (also the next
    epoch's, from a checkpoint of an epoch's last step: 16 of its 32 batches of 32 after 16 of 64). The training
    loader continues after the same samples (data.sampling.ResumableLoader). The `loops` layout is Lightning's own."""
    loops = checkpoint.get("loops", {}).get("fit_loop", {})
    batches = loops.get("epoch_loop.batch_progress")
    position = (loops.get("state_dict", {}).get("combined_loader") or [{}])[0]
    if not batches or not position.get("samples_done"):
        return
    change = position["samples_done"] // samples_per_micro_batch - batches["current"]["ready"]
    for span in ("total", "current"):
        for field in ("ready", "started", "processed", "completed"):
            batches[span][field] += change


def batches_that_stepped(trainer: L.Trainer) -> int:
    """The step counter the loggers' `step` is (optimizer steps, not trainer.global_step, which counts every
    optimizer of every step): no public name."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def set_batches_that_stepped(trainer: L.Trainer, value: int) -> None:
    trainer.fit_loop.epoch_loop._batches_that_stepped = value


def step_interval(callback: ModelCheckpoint) -> tuple[int, timedelta | None]:
    """(every_n_train_steps, train_time_interval) as the callback was built: no public getter."""
    return callback._every_n_train_steps, callback._train_time_interval


def save_now(callback: ModelCheckpoint, trainer: L.Trainer) -> None:
    """Save as ModelCheckpoint does on a step it saves on, unless this step was saved already: Lightning saves
    either every N steps or every N epochs, and has no public call for one more save."""
    if not callback._should_skip_saving_checkpoint(trainer):
        callback._save_topk_checkpoint(trainer, callback._monitor_candidates(trainer))


def mark_saved(callback: ModelCheckpoint, global_step: int) -> None:
    """Tell the callback this step is saved already (the checkpoint a training resumed from)."""
    callback._last_global_step_saved = global_step


def wandb_started(logger: WandbLogger) -> bool:
    """Whether the logger's wandb run has started: asking `logger.experiment` would start it."""
    return logger._experiment is not None


def wandb_attached(logger: WandbLogger) -> bool:
    """Whether this is a process ddp_spawn started, whose logger came pickled with the wandb run its command's
    process started (Lightning's WandbLogger attaches to it on first use)."""
    return getattr(logger, "_attach_id", None) is not None


def drop_anonymous(logger: WandbLogger) -> None:
    """Lightning passes anonymous=None to wandb.init when it is not given, which this wandb warns about (the setting
    has no effect): not passed at all."""
    if logger._wandb_init.get("anonymous") is None:
        logger._wandb_init.pop("anonymous", None)


def wandb_run_id(logger: WandbLogger) -> str:
    """The id the logger will start its wandb run with: before it starts, no public getter."""
    return logger._wandb_init["id"]


def has_trainer(module: L.LightningModule) -> bool:
    """Whether the module is attached to a trainer: `module.trainer` raises when it is not."""
    return module._trainer is not None


def set_device(module: L.LightningModule, device) -> None:
    """`module.device` of a DataParallel replica (a shallow copy of the root's module, which copies its device)."""
    module._device = device


# What Lightning's launcher sets in the first process of a ddp training, and leaves set
LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
# Those variables as this process's last training found them, and whether its launcher started processes since
LAST_TRAINING: dict[str, Any] = {"found": {}, "started": False}


def launch_this_job() -> None:
    """Lightning's launcher, ready for this training, one job of a --multirun maybe. It starts a ddp training's other
    processes with the command line this process was started with: each of them ran the whole sweep, with a sweep
    folder of its own, its later jobs joining the next job's first process (which, its LOCAL_RANK left set by the
    launcher, took them for started already). They run this job's command, in this job's folder; each job starts its
    own, with a process group of its own (the previous job's, left by Lightning, has lost its other processes)."""
    subprocess_script._hydra_subprocess_cmd = job_command  # (Trainer's launcher: its import of fabric's function)
    if LAST_TRAINING["started"]:
        for name, value in LAST_TRAINING["found"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    LAST_TRAINING.update(found={name: os.environ.get(name) for name in LAUNCH_VARIABLES}, started=False)


def job_command(local_rank: int) -> tuple[list[str], str]:
    """(The command of the process of `local_rank`, the folder to start it in): Lightning's own, for this job."""
    LAST_TRAINING["started"] = True
    hydra = HydraConfig.get()
    command = [sys.executable, "-m", sys.modules["__main__"].__spec__.name, *this_job()]
    # (no config.yaml of Hydra's, which the first process writes)
    command += [
        f"hydra.run.dir={hydra_quoted(hydra.runtime.output_dir)}",
        f"hydra.job.name=train_ddp_process_{local_rank}",
        "hydra.output_subdir=null",
    ]
    return command, hydra.runtime.cwd
