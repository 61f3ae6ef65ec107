"""A run's checkpoints (`<run dir>/checkpoints/`), written so that a kill never leaves a broken one behind, and
loading a trained net from one without Accelerate, for evaluation.

Each checkpoint is an `Accelerator.save_state` folder, `step-<global step>/`: the net, the optimizer, the
gradient scaler, every process's random number generator states (`random_states_<process>.pkl`) and the
loop's registered objects (its progress first); the net and optimizer of model_parallel (sharded) and pipeline (cut
into stages) are in its `sharded/` (torch.distributed.checkpoint, each process its own part). `last` and `best`
are symbolic links to such folders.
Accelerate writes a folder file by file, so a kill in the middle leaves half a folder: here every process
writes into a hidden `.step-<N>.partial/`, and only once all have finished does the main process rename it into
place and move the links (renames, which a kill cannot leave half done). A half-written folder is never
pointed at, and the next save removes it. With several machines, the run folder must be on a filesystem they
share (as a cluster's home or project space is).
"""

import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from accelerate.utils import OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, SCALER_NAME
from hydra.utils import instantiate
from safetensors.torch import load_file, load_model, save_model
from torch import nn

from ..errors import ConfigError, said_once
from ..runtime.checkpoint_files import last_of_run_folder, pickled_keys_include
from ..runtime.checkpoint_forms import is_numbered, nested, read_parts
from ..runtime.resuming import check_keep_last, other_process_count_note, trained_config

STEP_FOLDER = re.compile(r"step-\d{7,}")  # the run's own checkpoints, step-<global step in 7 digits or more>
LAST = "last"  # checkpoints/last: the link to the run's last complete checkpoint (both engines name it LAST)
PROGRESS = "custom_checkpoint_0.pkl"  # accelerate's name for the first registered object's state: the loop's Progress


class Checkpoints:
    """`<run dir>/checkpoints/`: complete `step-<N>/` folders, `last` and `best` pointing at them.

    Kept: the `keep_last` newest folders (`last` points at the newest) and the one `best` points at; each save
    removes the others.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        folder: Path,
        sharded: Any | None = None,
        keep_last: int = 1,
        net: nn.Module | None = None,
    ) -> None:
        check_keep_last(keep_last)
        self.accelerator, self.folder, self.keep_last = accelerator, folder, keep_last
        self.net = net  # unwrapped: another preset's parts are put together into it (as_whole)
        self.sharded = sharded  # the strategy's sharded state (model_parallel, pipeline), written by every process
        self.unlinked: tuple[str, bool] | None = None  # checkpoint.async=true: (name, best) being written

    def load(self, checkpoint: Path) -> None:
        """Restore everything `checkpoint` holds. All processes call this."""
        self.check_complete(checkpoint)
        saved, processes = len(list(checkpoint.glob("random_states_*.pkl"))), self.accelerator.num_processes
        if saved != processes and self.accelerator.is_main_process:  # accelerate only logs it, at the INFO level
            warnings.warn(other_process_count_note(saved, processes), stacklevel=2)
        if self.sharded is None and (checkpoint / "sharded").is_dir():  # another preset's parts: put together
            with as_whole(checkpoint, self.net) as whole:
                self.accelerator.load_state(whole)
        else:
            self.accelerator.load_state(checkpoint)
        if self.sharded is not None:
            self.sharded.load(checkpoint)

    def check_complete(self, checkpoint: Path) -> None:
        """Refuse a checkpoint folder missing a file accelerate's load_state opens: the state of a registered object
        (its RuntimeError counting them), the optimizer's or the gradient scaler's (a FileNotFoundError), or every
        random state (a resume that went on with other random numbers than the uninterrupted run's, without a
        word). A copy cut short, a file deleted: said in one line, with what to do."""
        expected = [f"custom_checkpoint_{index}.pkl" for index in range(len(self.accelerator._custom_objects))]
        if self.sharded is not None or not (checkpoint / "sharded").is_dir():  # (else put together: as_whole)
            optimizers = range(len(self.accelerator._optimizers))  # those it prepared: one file each
            expected += [f"{OPTIMIZER_NAME}{f'_{index}' if index else ''}.bin" for index in optimizers]
        if self.accelerator.scaler is not None and not (checkpoint / SCALER_NAME).is_file():  # (16-mixed on a GPU)
            raise said_once(
                ConfigError(
                    f"{checkpoint}: no {SCALER_NAME}, the gradient scaler's state trainer.precision=16-mixed "
                    "continues: saved at another precision (or cut short); continue at its precision, or give "
                    "another checkpoint"
                ),
                self.accelerator.is_main_process,
            )
        if not any(checkpoint.glob("random_states_*.pkl")):
            expected += ["random_states_0.pkl"]
        if missing := [name for name in expected if not (checkpoint / name).is_file()]:
            raise said_once(
                ConfigError(
                    f"{checkpoint}: {', '.join(missing)} missing (a copy cut short, a file deleted?): give another "
                    "checkpoint (ckpt_path=), or resume=false to train afresh"
                ),
                self.accelerator.is_main_process,
            )

    @property
    def last(self) -> Path | None:
        """The latest complete checkpoint, or None before the first."""
        last = self.folder / LAST
        return last if last.is_dir() else None

    def save(self, step: int, best: bool = False) -> None:
        """Save the state of every process as `step-<step>/` and point `last` (and `best`) at it. All processes
        call this."""
        self.link_written(wait=True)  # the one written in the background before: in place first
        name = f"step-{step:07d}"
        partial = self.folder / f".{name}.partial"
        if self.accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)  # left by a save that was killed at this step
        self.accelerator.wait_for_everyone()
        self.accelerator.save_state(partial)
        if self.sharded is not None:
            self.sharded.save(partial / "sharded")
        self.accelerator.wait_for_everyone()  # every process's files are written (or, async, its parts started)
        if self.sharded is not None and self.sharded.writer.in_flight:  # checkpoint.async=true: in place once written
            self.unlinked = (name, best)
            return
        self._put_in_place(name, best)
        self.accelerator.wait_for_everyone()  # no process goes on (and maybe reads `last`) before it moved

    def link_written(self, wait: bool = False) -> None:
        """Put the checkpoint written in the background in place (`last`, `best`), if its write has ended (or,
        `wait`, once it has). Every process asks its own write; the main process's ends last (async_saves.py)."""
        if self.unlinked is not None and self.sharded.writer.finished(wait):
            self._put_in_place(*self.unlinked)
            self.unlinked = None

    def finish(self) -> None:
        """Before `last` or `best` is read: the checkpoint being written in place. All processes call this."""
        self.link_written(wait=True)
        self.accelerator.wait_for_everyone()

    def _put_in_place(self, name: str, best: bool) -> None:
        """The main process renames the complete `.<name>.partial` into place and moves the links to it."""
        if self.accelerator.is_main_process:
            target = self.folder / name
            if target.exists():  # saved before by a run resumed from an earlier checkpoint: replace it
                target.rename(self.folder / f".{name}.replaced")
            (self.folder / f".{name}.partial").rename(target)
            self._point(LAST, name)
            if best:
                self._point("best", name)
            self._remove_unreferenced()

    def clear(self) -> None:
        """Remove every checkpoint of the run (resume=false). All processes call this."""
        if self.accelerator.is_main_process:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def _point(self, link: str, name: str) -> None:
        """Make `link` point at `name`: a new link, renamed over the old one (os.replace is atomic)."""
        new = self.folder / f".{link}.new"
        new.unlink(missing_ok=True)
        new.symlink_to(name, target_is_directory=True)  # relative: the run folder can be moved or copied
        os.replace(new, self.folder / link)

    def _remove_unreferenced(self) -> None:
        """The run's own step checkpoints but the keep_last newest and those `last` and `best` name; no other folder
        (a checkpoint of the user's put there, a pretrained one given as ckpt_path=, was deleted)."""
        kept = {os.readlink(self.folder / link) for link in (LAST, "best") if (self.folder / link).is_symlink()}
        steps = sorted(path for path in self.folder.glob("step-*") if STEP_FOLDER.fullmatch(path.name))
        kept |= {path.name for path in steps[-self.keep_last :]}  # zero-padded: by step
        for path in steps:
            if path.is_dir() and not path.is_symlink() and path.name not in kept:
                shutil.rmtree(path)


def read_whole(checkpoint: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The net and optimizer state of any preset's checkpoint as one device's: the net by name, the optimizer state
    keyed by parameter name (runtime/checkpoint_forms.py), from the parts (`sharded/`) or the whole-model files."""
    if (checkpoint / "sharded").is_dir():
        parts = read_parts(checkpoint / "sharded")
        return parts["model"], nested(parts["optimizer"])
    optimizer = torch.load(checkpoint / f"{OPTIMIZER_NAME}.bin", map_location="cpu", weights_only=False)
    if is_numbered(optimizer):
        raise ConfigError(
            f"{checkpoint} numbers its optimizer state (written before checkpoints named each parameter's): it "
            "resumes under the preset that wrote it only"
        )
    return load_file(checkpoint / SAFE_WEIGHTS_NAME), nested(optimizer)


@contextmanager
def as_whole(checkpoint: Path, net: nn.Module) -> Iterator[Path]:
    """A checkpoint of a preset that writes parts as a whole-model preset's, for accelerate's load_state: its files
    linked into a temporary folder (this process's), beside the net and optimizer files put together from its parts.
    The net's file is written as accelerate writes it (safetensors' save_model: a tied parameter under one name),
    from `net` (the run's, unwrapped) with the parts' weights."""
    model, optimizer = read_whole(checkpoint)
    net.load_state_dict(model)
    with tempfile.TemporaryDirectory(prefix="whole-") as folder:
        whole = Path(folder)
        for path in checkpoint.iterdir():
            if path.name != "sharded":
                (whole / path.name).symlink_to(path.resolve())
        save_model(net, str(whole / SAFE_WEIGHTS_NAME))
        torch.save(optimizer, whole / f"{OPTIMIZER_NAME}.bin")
        yield whole


def trained_so_far(checkpoint: Path) -> tuple[int, int]:
    """(whole epochs, optimizer steps) a checkpoint has trained, from its Progress."""
    progress = torch.load(checkpoint / PROGRESS, map_location="cpu", weights_only=False)
    return progress["epoch"], progress["global_step"]


def saved_by_layers(checkpoint: Path) -> bool:
    """Whether `checkpoint` was saved by model_parallel mode=layers: its net and optimizer in save_state's first custom
    object after the progress (WholeState), where the other presets keep their learning-rate schedule."""
    whole_state = checkpoint / "custom_checkpoint_1.pkl"
    return has_no_weights(checkpoint) and whole_state.is_file() and bool(pickled_keys_include(whole_state, "model"))


def no_net(checkpoint: Path) -> ConfigError:
    """The refusal of a checkpoint folder with no net in it (a copy that stopped): accelerate's traceback else."""
    return ConfigError(
        f"{checkpoint} holds no net: neither model.safetensors nor sharded/, nor model_parallel's layer-mode state (a "
        "copy cut short?); give another checkpoint"
    )


def has_no_weights(checkpoint: Path) -> bool:
    """Whether a checkpoint folder holds neither model.safetensors nor sharded/, where the presets but
    model_parallel's layer mode keep the net."""
    return (
        checkpoint.is_dir() and not (checkpoint / "sharded").is_dir() and not (checkpoint / SAFE_WEIGHTS_NAME).exists()
    )


def load_trained(checkpoint: str | Path, config: str | Path | None = None) -> nn.Module:
    """The net of a run, with the weights of `checkpoint`, on the CPU and in eval mode.

    The architecture comes from the run's resolved config (`<run dir>/config.yaml`, the default for a
    checkpoint in `<run dir>/checkpoints/`). single, ddp and dp save the net as model.safetensors; model_parallel
    and pipeline as every process's part, its shards or its stage (`sharded/`, DCP; model_parallel's layer mode in
    one state file, `WholeState`). Either way it loads on one device.
    """
    checkpoint = last_of_run_folder(Path(checkpoint), LAST)
    if not (checkpoint / PROGRESS).is_file():
        raise FileNotFoundError(
            f"{checkpoint} is not a checkpoint of this project: give a run folder or one of its checkpoints "
            "(<run dir>/checkpoints/last)"
        )
    net = instantiate(trained_config(checkpoint, config).model.net)
    if (checkpoint / "model.safetensors").is_file():
        # safetensors' loader: the file holds a tied parameter (model=gpt's embedding and head) under one name only
        load_model(net, checkpoint / "model.safetensors")
    elif (checkpoint / "sharded").is_dir():  # model_parallel, pipeline: every process's part, put together here
        state = {"model": net.state_dict()}
        with warnings.catch_warnings():  # that it reads in one process: what no_dist asks for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=checkpoint / "sharded", no_dist=True)
        net.load_state_dict(state["model"])
    else:  # custom_checkpoint_0 is the loop's progress; the strategy's state comes next
        state = torch.load(checkpoint / "custom_checkpoint_1.pkl", map_location="cpu", weights_only=False)["model"]
        net.load_state_dict(state)
    return net.eval()
