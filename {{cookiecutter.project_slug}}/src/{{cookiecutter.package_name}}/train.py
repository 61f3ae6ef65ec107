"""Train, then test, a model. Run from the project root:

    python -m {{ cookiecutter.package_name }}.train [hydra overrides, e.g. strategy=ddp trainer.devices=2]

The engine trains (engine/training.py: data, model, strategy, loop or Trainer, checkpoints); this command
composes the config and reports what stops the training in one line (errors.py): a refused config exits 2 and
leaves no run folder behind, a training that stopped itself or a crashed process exits 1 and keeps what it wrote.
"""

from contextlib import nullcontext
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from .config.command_line import run_cli
from .config.objects import register_resolvers, unresolved
from .engine.checkpoints import LAST
from .engine.training import train
from .errors import (
    UNRESOLVED,
    ConfigError,
    Interrupted,
    ProcessCrashed,
    TrainingStopped,
    fail,
    remove_if_empty,
)
from .parallel.launcher import lost_peer
from .runtime.checkpoint_files import last_of_run_folder, out_of_space, permission_denied
from .runtime.interrupt import continuing, sigterm_as_ctrl_c
from .runtime.run_folder import RunFolderInUse, only_training_in

register_resolvers()


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def run(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.ckpt_path and HydraConfig.get().job.chdir:  # from where the command was typed, not the run folder
        cfg.ckpt_path = to_absolute_path(str(cfg.ckpt_path))
    if cfg.ckpt_path:  # a run folder: its last checkpoint, as load_trained takes it
        cfg.ckpt_path = str(last_of_run_folder(Path(cfg.ckpt_path), LAST))
    try:
        # check_only writes nothing: it may check a command for a folder in use (a launch script re-run on a node
        # that replaces a dead one, while the other nodes' processes hold the folder)
        with nullcontext() if cfg.check_only else only_training_in(run_dir), sigterm_as_ctrl_c():
            train(cfg)
        if cfg.check_only:
            remove_if_empty(run_dir)
        elif not (run_dir / "config.yaml").exists():  # the folder removed while it trained, between two writes (or
            # remade by the next: Lightning's): "finished", exit 0, its config, starts and wandb run lost
            raise folder_removed(run_dir)
    except RunFolderInUse as err:  # the folder is the other training's: left as it is
        fail(err)
    except (ConfigError, ProcessCrashed) as err:
        fail(err, run_dir)
    except UNRESOLVED as err:  # a resolver's ConfigError (data=files checks its files), or a ??? left unset
        fail(unresolved(err), run_dir)
    except TrainingStopped as err:  # e.g. out of memory again and again: what to try, in one line (exit 1)
        fail(err)
    except Exception as err:  # a crash (a bug, a class of yours raising): its traceback, and no empty run folder left
        if out_of_space(err, run_dir):  # (a checkpoint's write: torch's 60-line traceback, which named no disk)
            again = continuing(cfg.run_id, run_dir) if (run_dir / "checkpoints" / LAST).exists() else "start it again"
            fail(TrainingStopped(f"no space left on the disk of {run_dir} (a file's write there failed): free some, "
                                 f"then {again}"))  # fmt: skip
        if denied := permission_denied(err, run_dir):  # (torch's, fsspec's or safetensors' traceback otherwise)
            ours = denied.resolve().is_relative_to(run_dir.resolve())
            fail(TrainingStopped(f"permission denied: this user may not open {denied} (another user's, or a read-only "
                                 "mount): change its permissions" + (", or train in a run folder of your own "
                                 "(hydra.run.dir=FOLDER)" if ours else "")))  # fmt: skip
        if not run_dir.exists():  # (a FileNotFoundError's traceback from whichever file was written next)
            fail(folder_removed(run_dir))
        if cfg.ckpt_path and not Path(cfg.ckpt_path).exists():  # (it was there when checked: a FileNotFoundError)
            fail(TrainingStopped(f"ckpt_path={cfg.ckpt_path} was removed while it was read: the training that wrote "
                                 "it is running and keeps only its newest; give it again (a run folder: its newest), "
                                 "or copy a checkpoint out first"))  # fmt: skip
        if peer := lost_peer(err):  # (under torchrun: it starts them all again, if restarts are left)
            fail(TrainingStopped(f"another process of this training stopped (gloo: {peer}): its output says why"))
        remove_if_empty(run_dir)
        raise
    except KeyboardInterrupt:  # Ctrl-C before the training answers it (starting: the data, wandb), or a second one
        fail(Interrupted(f"interrupted, at once: {continuing(cfg.run_id, run_dir)}"))


def folder_removed(run_dir: Path) -> TrainingStopped:
    return TrainingStopped(f"the run folder {run_dir} was removed while the training ran: start it again")


def main() -> None:
    run_cli(run)


if __name__ == "__main__":
    main()
