"""Checkpoints a training can trust: written every N steps and at each epoch's end, `last.ckpt` switched to a new
one only once it is complete, found again by a restart; and loading a trained model without the Trainer."""

import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ..parallel.launcher import is_first_process
from ..runtime.checkpoint_files import DCP_INDEX, last_of_run_folder, written_by_torch
from ..runtime.interrupt import Interrupt
from ..runtime.resuming import (
    afresh_message,
    check_keep_last,
    other_process_count_note,
    resuming_message,
    starting_from_message,
    trained_config,
)
from ..tracking.wandb_run import forget_wandb_run
from .lightning_private import (
    batches_that_stepped,
    mark_saved,
    only_accumulates,
    save_now,
    set_batches_that_stepped,
    step_interval,
)
from .module import Classifier, build_module
from .strategies.sharded_checkpoints import META, read_whole

LAST = "last.ckpt"


class ModelCheckpoint(LightningModelCheckpoint):
    """Lightning's ModelCheckpoint (configs/callbacks/checkpoint.yaml: the best by checkpoint.monitor), with the work
    it does on every training step made cheap: its state key, a repr of its settings that Lightning builds around
    every hook call, is built once; and a step on which no trigger saves returns at once (Lightning's own test does
    several calls first). Its class name stays, and with it the key its state is saved under in checkpoints."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state_key = super().state_key  # from settings that do not change after __init__

    @property
    def state_key(self) -> str:
        return self._state_key

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A run continued in its own folder after the folder moved (copied to another machine, the project renamed,
        another mount): Lightning, seeing another dirpath in the state, forgot the run's best, and the test pass took
        a worse checkpoint saved after the move, silently. Where the best checkpoint's file is in this folder, the
        saved paths are taken to it; a checkpoint of another run (ckpt_path=) keeps Lightning's way (its own best)."""
        saved = state_dict.get("dirpath")
        if saved and self.dirpath and saved != self.dirpath:

            def moved(path: Any) -> Any:
                inside = isinstance(path, str) and path and Path(path).is_relative_to(saved)
                return str(Path(self.dirpath) / Path(path).relative_to(saved)) if inside else path

            best = moved(state_dict.get("best_model_path"))
            if best and Path(best).is_file():
                keys = ("best_model_path", "kth_best_model_path", "last_model_path")
                state_dict = {
                    **state_dict,
                    "dirpath": self.dirpath,
                    **{key: moved(state_dict.get(key)) for key in keys},
                }
                state_dict["best_k_models"] = {moved(k): v for k, v in state_dict.get("best_k_models", {}).items()}
        super().load_state_dict(state_dict)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        every, interval = step_interval(self)
        if interval is None and (every < 1 or trainer.global_step % every):
            return  # what Lightning's decides when no time interval is set and the step is not a multiple
        super().on_train_batch_end(trainer, pl_module, *args)


class ResumeCheckpoint(ModelCheckpoint):
    """The checkpoint a training resumes from: `every_n_steps` optimizer steps and at the end of every epoch, each
    to a new `step<N>.ckpt`; then `last.ckpt`, a link, is switched to it in one atomic rename; then the previous
    one is deleted. A process killed during a save therefore leaves `last.ckpt` on the previous, complete one.
    (Lightning writes a checkpoint file through a temporary file that it moves into place, but moves across
    filesystems copy; and sharded checkpoints are folders written in place. Its save_last="link" deletes the old
    link before making the new one, and the old checkpoint before both.)

    Lightning saves model, optimizer, LR schedulers, gradient scaler, loop counters (global step, epoch, batch in
    the epoch), the stateful callbacks and the training loader's position (data.sampling.ResumableLoader). It does
    not save random number generators: this adds every rank's.
    """

    def __init__(self, dirpath: str, every_n_steps: int, keep_last: int = 1) -> None:
        check_keep_last(keep_last)
        super().__init__(
            dirpath=dirpath,
            filename="step{step:06d}",
            auto_insert_metric_name=False,
            every_n_train_steps=every_n_steps,
            save_top_k=1,  # monitor=None: the latest only; the previous is deleted after the link moved on
            enable_version_counter=False,
        )
        self.keep_last = keep_last
        self._logged_steps: int | None = None
        self.interrupt = Interrupt()
        self.interrupted_at: int | None = None  # the step a Ctrl-C stopped the training after
        self.unlinked: Path | None = None  # the checkpoint `last` moves to once its step is logged (and written)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning's own SIGTERM handler, which would end the training its way
        self.interrupt.install(trainer.world_size, announce=trainer.is_global_zero)
        # Resumed from a checkpoint of an epoch's end with trainer.max_steps set, Lightning (2.6) first goes through
        # the end of that epoch again, training nothing; it calls on_train_epoch_end again (on_load_checkpoint
        # keeps this callback from writing the checkpoint it resumed from once more, in place) and counts one more
        # step for the loggers, which would log every later step one too far. The count is put back below.
        if trainer.fit_loop.restarted_on_epoch_end:
            self._logged_steps = batches_that_stepped(trainer)
        if restored_after_an_epochs_last_batch(trainer.fit_loop):
            # Lightning (2.6) counted that epoch done as it restored the checkpoint, and keeps taking the run for one
            # restarted inside an epoch until it ends: the next epochs' starts would go uncounted (and their
            # on_train_epoch_start hooks uncalled), so every checkpoint this run saves would be an epoch behind. From
            # here on it is a run like any other.
            trainer.fit_loop.reset_restart_stage()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._link_written(trainer)  # the step saved before this batch is logged by now

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._link_written(trainer)  # a checkpoint written in the background since the last batch: `last` now
        # The epoch's last step is saved at the epoch's end, after its validation: a checkpoint saved before it was
        # taken for the whole epoch's when resumed (Lightning 2.6), which left out that validation, unsaid.
        last_of_epoch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        if not last_of_epoch:
            super().on_train_batch_end(trainer, pl_module, *args)  # the checkpoint every N steps
        if self._stopped_mid_epoch(trainer, batch_idx=args[-1]):
            # Saved here, at the step: by on_train_epoch_end, Lightning has counted this epoch as done, and the run
            # continued from there went on with the next epoch, leaving out the rest of this one.
            save_now(self, trainer)
            # Stopping, Lightning validates these last steps too (the best checkpoint, the test pass and a search's
            # value left them out, unsaid)
            trainer.should_stop = True
        if self.interrupted_at is None and self._stop_now(trainer):  # Ctrl-C: save this step, then stop
            self.interrupted_at = trainer.global_step
            self.interrupt.restore()
            if last_of_epoch:  # after the epoch's validation (on_train_epoch_end)
                return
            save_now(self, trainer)
            trainer.should_stop = True
            trainer.limit_val_batches = 0  # Lightning validates a run stopped mid-epoch; one never stopped would not

    @staticmethod
    def _stopped_mid_epoch(trainer: L.Trainer, batch_idx: int) -> bool:
        """Whether trainer.max_steps ends the training at this step, before the epoch's last batch."""
        if trainer.max_steps < 1 or trainer.global_step < trainer.max_steps or only_accumulates(trainer):
            return False
        return batch_idx + 1 < trainer.num_training_batches

    def _stop_now(self, trainer: L.Trainer) -> bool:
        if only_accumulates(trainer):  # at an optimizer step's end
            return False
        if trainer.world_size == 1:
            return self.interrupt.requested
        # Several processes agree at a logged step; every one asks, with its handler or without (ddp_spawn's)
        if trainer.global_step % trainer.log_every_n_steps:
            return False
        return trainer.strategy.reduce_boolean_decision(self.interrupt.requested, all=False)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._link_written(trainer, wait=True)
        self.interrupt.restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # A checkpoint still being written is not waited for (its writer may wait on a process that failed): `last`
        # stays on the previous one.
        self.interrupt.restore()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._logged_steps is not None:
            set_batches_that_stepped(trainer, self._logged_steps)
            self._logged_steps = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        progress = trainer.fit_loop.epoch_progress
        if trainer.fit_loop.restarted_on_epoch_end and progress.current.processed > progress.current.completed + 1:
            # That pass through the end of the epoch resumed from (see on_train_start) counted the epoch processed
            # a second time: the next epoch then read the data in the order of the one after it (its sampler's
            # epoch is that count) and the training ended an epoch early (Lightning 2.6, trainer.max_steps set; an
            # epoch-based training is restored without the pass). Counted once:
            progress.current.processed -= 1
            progress.total.processed -= 1
        # ModelCheckpoint saves either every N steps or every N epochs; this one does both.
        save_now(self, trainer)  # unless this step was saved already
        self._link_written(trainer)  # (the epoch's last step is logged)
        if self.interrupted_at == trainer.global_step:  # a Ctrl-C at the epoch's last step: stopped here
            trainer.should_stop = True

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        self._link_written(trainer, wait=True)  # the one written in the background before: `last` on it first
        super()._save_checkpoint(trainer, filepath)  # returns once every rank has written its part, or started to
        # `last` moves on once the step is logged (Lightning logs it after this hook): killed in between, the
        # training went on after a step whose metrics were never written, in the run files or wandb.
        self.unlinked = Path(filepath)

    def _link_written(self, trainer: L.Trainer, wait: bool = False) -> None:
        """Point `last` at the checkpoint saved at a step that is logged by now, once it is written: one written in
        the background (checkpoint.async=true), if its write has ended (or, `wait`, once it has). Every process asks
        its own write; the first process's ends last (runtime/async_saves.py)."""
        writer = getattr(trainer.strategy, "checkpoint_writer", None)
        background = writer is not None and writer.in_flight
        if self.unlinked is None or (background and not writer.finished(wait)):
            return
        if trainer.is_global_zero:
            point_last_at(self.unlinked)
        self.unlinked = None
        self._remove_old(trainer)  # (the one resumed from too, which Lightning never names for removal)

    def _remove_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        # Lightning keeps one checkpoint when none is monitored and names the previous one for removal once the new
        # one is saved; Lightning has no "keep the last K": _remove_old, after every save, instead.
        pass

    def _remove_old(self, trainer: L.Trainer) -> None:
        """The keep_last newest step checkpoints of the folder stay (also those of an earlier start of the run), the
        older ones go; never the one last.ckpt points at."""
        folder = Path(self.dirpath)
        for old in step_checkpoints(folder)[: -self.keep_last]:
            if old.name != os.path.basename(os.path.realpath(folder / LAST)):
                super()._remove_checkpoint(trainer, str(old))

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Every rank calls this while the checkpoint is assembled; rank 0 writes the list.
        state = random_state()
        states = [state] * trainer.world_size
        if dist.is_available() and dist.is_initialized():
            dist.all_gather_object(states, state)
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        mark_saved(self, checkpoint["global_step"])  # saved already: the checkpoint resumed from
        states = checkpoint.get("rng_states", [])
        if len(states) == trainer.world_size:
            set_random_state(states[trainer.global_rank])
        elif states:
            rank_zero_warn(other_process_count_note(len(states), trainer.world_size))


def restored_after_an_epochs_last_batch(loop: Any) -> bool:
    """Whether the fit loop restored a checkpoint saved on an epoch's last step, before that epoch's end (Lightning's
    own test for it, FitLoop.reset)."""
    epoch_loop = loop.epoch_loop
    return (
        loop.restarted_mid_epoch and epoch_loop.restarted_on_train_batch_end and epoch_loop.batch_progress.is_last_batch
    )


class AnyPresetCheckpointIO(TorchCheckpointIO):
    """How the whole-model presets (single, ddp, ddp_spawn, dp) write and read checkpoint files, Lightning's, which also
    reads the folder a preset whose processes write parts (fsdp, model_parallel, pipeline) saved, as one device's:
    a training resumes under another preset (the optimizer takes the state keyed by name: checkpoint_forms.py)."""

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if Path(path).is_dir():
            return read_whole(Path(path), weights_only)
        return super().load_checkpoint(path, map_location, weights_only)


def random_state() -> dict[str, Any]:
    """This process's random generators (torch, CUDA, numpy, Python), in types that torch.load(weights_only=True)
    accepts (Lightning's own collector keeps numpy arrays, which it refuses)."""
    name, keys, position, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
        "python": random.getstate(),
    }


def set_random_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    random.setstate(state["python"])


def step_checkpoints(folder: Path) -> list[Path]:
    """The folder's step<N>.ckpt checkpoints (files, or sharded folders), oldest first."""
    return sorted(folder.glob("step*.ckpt"), key=lambda path: int(path.stem.removeprefix("step")))


def point_last_at(checkpoint: Path) -> None:
    """Make <dir>/last.ckpt a relative link to `checkpoint` (a file or a sharded folder) in one rename."""
    link = checkpoint.with_name(f".{LAST}.new")
    link.unlink(missing_ok=True)
    os.symlink(checkpoint.name, link)
    os.replace(link, checkpoint.with_name(LAST))


def resume_from(run_dir: Path, ckpt_path: str | None, resume: bool) -> str | None:
    """The checkpoint this training starts from: `ckpt_path` if given, else the run's last complete one (a restart
    with the same run id), else none. Changes nothing: prepare_run_folder acts on it once the config is checked."""
    last = run_dir / "checkpoints" / LAST
    if ckpt_path:
        return os.path.realpath(ckpt_path)  # a link (last.ckpt) to the checkpoint it points at
    return os.path.realpath(last) if resume and last.exists() else None


def saved_state(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's non-tensor part (loop counters, callbacks): the file itself, or a folder's meta.pt; mmap: the
    tensors are not read."""
    path = Path(checkpoint)
    return torch.load(
        path / META if path.is_dir() else path, map_location="cpu", mmap=path.is_file(), weights_only=False
    )


def trained_so_far(saved: dict[str, Any]) -> tuple[int, int] | None:
    """(whole epochs, optimizer steps) a checkpoint (its saved_state) has trained, from its fit loop's counters (None
    without them)."""
    if "loops" not in saved or "global_step" not in saved:
        return None
    fit_loop = saved["loops"]["fit_loop"]
    epochs = fit_loop["epoch_progress"]["current"]
    # Saved at an epoch's last step (every_n_steps there, before its validation), the epoch is not counted processed
    # yet, though every batch of it is trained
    last_batch = fit_loop.get("epoch_loop.batch_progress", {}).get("is_last_batch", False)
    return epochs["processed"] + (last_batch and epochs["processed"] < epochs["started"]), saved["global_step"]


def mid_epoch_position(saved: dict[str, Any], finder: bool) -> dict[str, int]:
    """The training loader's state in a checkpoint (its saved_state) saved inside an epoch; {} for one saved at an
    epoch's end (the next epoch starts afresh), or, where this run has the batch-size finder (`finder`), with a batch
    it found (the run continues with that batch)."""
    fit_loop = saved.get("loops", {}).get("fit_loop", {})
    found = finder and any("global_batch_size" in state for state in saved.get("callbacks", {}).values())
    if found or fit_loop.get("epoch_loop.batch_progress", {}).get("is_last_batch", True):
        return {}
    return (fit_loop["state_dict"].get("combined_loader") or [{}])[0]


def prepare_run_folder(run_dir: Path, ckpt_path: str | None, resume: bool) -> None:
    """Say where the training starts; resume=false deletes a previous training's checkpoints and wandb run id in
    this folder (first process), so that it starts afresh. Run after every check: a refused command deletes nothing."""
    for stale in sorted(run_dir.glob("hpc_ckpt_*.ckpt")) if is_first_process() else []:
        # Lightning's SLURM auto-requeue (SIGUSR1 to the tasks) saved it wherever the signal landed, maybe inside a
        # step: not continued exactly, and Lightning would restore it by itself in a run starting afresh here.
        rank_zero_info(f"removing {stale.name}, Lightning's SLURM checkpoint (the run resumes from its own)")
        stale.unlink()
    last = run_dir / "checkpoints" / LAST
    if ckpt_path:
        rank_zero_info(starting_from_message(Path(ckpt_path)))
        return
    if not last.exists():
        return
    if resume:
        rank_zero_info(resuming_message(last))
        return
    rank_zero_info(afresh_message(run_dir))
    if is_first_process():
        shutil.rmtree(run_dir / "checkpoints")
        forget_wandb_run(run_dir)


def loadable_form(path: Path) -> bool:
    """Whether `path` has a form Lightning loads: a file torch.save wrote, or the folder of a preset that writes
    parts (fsdp, model_parallel, pipeline: DCP's, with its .metadata)."""
    return (path.is_file() and written_by_torch(path)) or (path / DCP_INDEX).is_file()


def load_trained(checkpoint: str | Path, config: str | Path | None = None) -> Classifier:
    """The model of a run, with the weights of `checkpoint`, on the CPU and in eval mode.

    The architecture comes from the run's resolved config (`<run dir>/config.yaml`, the default for a
    checkpoint in `<run dir>/checkpoints/`), so a checkpoint of any preset loads on one device: a file, or the
    folder of every process's part (torch.distributed.checkpoint) that model_parallel (its shards) and pipeline (its
    stages) write, put together here.
    """
    checkpoint = last_of_run_folder(Path(checkpoint), LAST)
    if not loadable_form(checkpoint):  # (missing, the other engine's, a folder of yours)
        raise FileNotFoundError(
            f"{checkpoint} is not a checkpoint of this project: give a run folder or one of its checkpoints "
            "(<run dir>/checkpoints/last.ckpt)"
        )
    model = build_module(trained_config(checkpoint, config).model)
    if checkpoint.is_dir():
        state = {"state_dict": model.state_dict()}
        with warnings.catch_warnings():  # that it reads in one process: what no_dist asks for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
        state = state["state_dict"]
    else:
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict(state)
    return model.eval()
