"""The private members of Lightning's classes the engine uses (engine/lightning_private.py) still exist: a Lightning
release that renames one fails here, by name, instead of deep inside a training."""

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.strategies.launchers import subprocess_script

from {{ cookiecutter.package_name }}.engine.lightning_private import PRIVATE_MEMBERS


def instances(tmp_path) -> dict[type, object]:
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    return {
        _FitLoop: trainer.fit_loop,
        _TrainingEpochLoop: trainer.fit_loop.epoch_loop,
        ModelCheckpoint: ModelCheckpoint(dirpath=tmp_path),
        WandbLogger: WandbLogger(save_dir=tmp_path, offline=True),
        L.LightningModule: L.LightningModule(),
        subprocess_script: subprocess_script,
    }


@pytest.mark.parametrize("owner", list(PRIVATE_MEMBERS), ids=lambda owner: owner.__name__)
def test_each_private_member_still_exists(tmp_path, owner):
    instance = instances(tmp_path)[owner]
    missing = [name for name in PRIVATE_MEMBERS[owner] if not hasattr(instance, name)]
    assert not missing, (
        f"Lightning {L.__version__} has no {owner.__name__}.{', '.join(missing)}: see lightning_private.py"
    )
