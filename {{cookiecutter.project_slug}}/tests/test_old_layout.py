"""A run folder written before the package was laid out in folders by concern (engine/, models/, data/, ...).

tests/old_layout_run is such a folder, written by the previous layout's training (3 steps, the settings below):
its config.yaml names classes by their old module paths (`<package>.model.ResidualMLP`). The training must still
resume it as it resumes a checkpoint this layout wrote, and load_trained must still read it.
"""

import os
import shutil

import pytest
import torch
from conftest import QUIET, make_runner
from engine_specific import LAST, OLD_RUN_LINKS

from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.runtime.resuming import moved_target

OLD_RUN = os.path.join(os.path.dirname(__file__), "old_layout_run")
SETTINGS = [
    *("model.net.hidden=8", "model.net.depth=1", "data.batch_size=64", "scheduler=constant"),
    *("checkpoint.every_n_steps=2", "trainer.log_every_n_steps=1", "test_after_fit=false", *QUIET),
]


def test_old_targets_are_renamed():
    assert moved_target("{{ cookiecutter.package_name }}.model.ResidualMLP").endswith(".models.mlp.ResidualMLP")
    assert moved_target("{{ cookiecutter.package_name }}.data.Data").endswith(".data.loading.Data")
    current = "{{ cookiecutter.package_name }}.data.synthetic.SyntheticData"
    assert moved_target(current) == current  # a target of this layout stays
    assert moved_target("my_pkg.model.Net") == "my_pkg.model.Net"  # not ours: never renamed


def test_load_trained_says_what_is_not_a_checkpoint_and_where_the_config_comes_from(tmp_path):
    """load_trained (docs/outputs.md) of a checkpoint copied out of its run folder, of a file or folder that is no
    checkpoint of this project: FileNotFoundErrors for a config.yaml one or two folders up, or (Lightning) DCP's
    "metadata is None"; now what it is, and for a copied checkpoint its `config=` argument."""
    run_dir = tmp_path / "old-run"
    shutil.copytree(OLD_RUN, run_dir)
    for link, target in OLD_RUN_LINKS.items():
        (run_dir / link).symlink_to(target)
    saved = (run_dir / LAST).resolve()
    copied = tmp_path / "copied" / saved.name  # (a downloaded checkpoint, say)
    copied.parent.mkdir()
    shutil.copytree(saved, copied) if saved.is_dir() else shutil.copy2(saved, copied)
    with pytest.raises(FileNotFoundError, match=r"config.yaml is missing \(.* is not in its run folder's checkpoints/"):
        load_trained(copied)
    net = load_trained(copied, config=run_dir / "config.yaml")
    assert isinstance(net if isinstance(net, ResidualMLP) else net.net, ResidualMLP)
    (tmp_path / "junk.ckpt").write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    for not_one in (tmp_path / "junk.ckpt", tmp_path / "empty"):
        with pytest.raises(FileNotFoundError, match="is not a checkpoint of this project: give a run folder"):
            load_trained(not_one)


@pytest.mark.slow
def test_a_run_folder_of_the_old_layout_resumes_exactly_and_loads(tmp_path, train_env):
    run_dir = tmp_path / "old-run"
    shutil.copytree(OLD_RUN, run_dir)
    for link, target in OLD_RUN_LINKS.items():
        (run_dir / link).symlink_to(target)
    net = load_trained(run_dir / LAST)  # read before the resumed training replaces the checkpoint
    assert isinstance(net if isinstance(net, ResidualMLP) else net.net, ResidualMLP)
    by_folder = load_trained(run_dir)  # a run folder: its last checkpoint (was a traceback naming another folder)
    assert all(map(torch.equal, net.state_dict().values(), by_folder.state_dict().values()))
    with pytest.raises(FileNotFoundError, match="is not a checkpoint of this project: give a run folder"):
        load_trained(run_dir / "checkpoints" / "step-9")

    runner = make_runner(tmp_path, train_env)
    ours = runner(*SETTINGS, "trainer.max_steps=3")  # this layout's checkpoint of the same 3 steps...
    ours = runner(*SETTINGS, "trainer.max_steps=5", run_dir=ours.run_dir)  # ...resumed to 5
    resumed = runner(*SETTINGS, "trainer.max_steps=5", run_dir=run_dir)
    assert "resuming from" in resumed.output
    # (Lightning: the old checkpoint was saved when max_steps stopped it mid-epoch, at the epoch's end as then; it
    # goes on with the rest of that epoch, as one this layout saves at the step does)
    assert resumed.losses(2) == ours.losses(5)[3:], "steps 4 and 5 as after this layout's own checkpoint"
