"""Where a start begins (resuming.py): a launcher's restart continues from the run's own last checkpoint whatever
the first start's ckpt_path= or resume=false, and checkpoints are resumed only by the training that wrote them (on
any preset, but not with another tensor-parallel size)."""

import errno
import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf
from safetensors.torch import save_file

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.config import overrides as config_overrides
from {{ cookiecutter.package_name }}.config.command_line import composed_experiment
from {{ cookiecutter.package_name }}.engine.checkpoints import LAST
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.gpt import GPT
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.runtime.checkpoint_files import last_of_run_folder, out_of_space, permission_denied
from {{ cookiecutter.package_name }}.runtime.interrupt import continue_last, continuing
from {{ cookiecutter.package_name }}.runtime.resuming import (
    ENGINE_LASTS,
    check_not_past_the_end,
    check_same_mesh,
    check_same_shapes,
    check_saved_run,
    schedule_length_note,
    starting_point,
    write_mesh,
)

RESTARTS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


def test_a_run_folder_as_ckpt_path_is_the_checkpoint_its_link_points_to(tmp_path):
    """ckpt_path=<run folder> (load_trained took one; ckpt_path did not): the checkpoint `last` points to now, not the
    link, which moves on while that run trains. Without a complete checkpoint yet: said so in one line (the refusal
    of a path that is no checkpoint said to give a run folder)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 1\n")
    assert last_of_run_folder(run, LAST) == run
    with pytest.raises(ConfigError, match=f"ckpt_path={run} is a run folder without a complete checkpoint"):
        check_saved_run(run, LAST)
    (run / "checkpoints" / "step000004").mkdir()
    (run / "checkpoints" / LAST).symlink_to("step000004")
    assert last_of_run_folder(run, LAST) == (run / "checkpoints" / "step000004").resolve()
    # its checkpoints folder too (Lightning's load_trained read it as a checkpoint: FileNotFoundError <run>/../config)
    assert last_of_run_folder(run / "checkpoints", LAST) == (run / "checkpoints" / "step000004").resolve()
    check_saved_run(run / "checkpoints" / "step000004", LAST)  # a checkpoint itself: not a run folder


def test_a_run_folder_of_the_other_engine_is_refused_not_trained_over(tmp_path):
    """The run folder of a project of the other engine (hydra.run.dir= it, or the same run_id in a shared outputs
    folder): its checkpoints were not read, and the training started again from step 0 in silence, mixing both
    engines' checkpoints and continuing its metrics and wandb run as if resumed. As ckpt_path=, it was called a run
    folder without a complete checkpoint."""
    [(other, engine)] = [(name, engine) for name, engine in ENGINE_LASTS.items() if name != LAST]
    run = tmp_path / "run"
    (run / "checkpoints" / "step").mkdir(parents=True)
    (run / "checkpoints" / other).symlink_to("step")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(training()))
    with pytest.raises(ConfigError) as refused:
        starting_point(run, training(), run / "checkpoints" / LAST)
    assert str(refused.value) == (
        f"{run} holds checkpoints of a project of the {engine} engine, which this project cannot continue: give "
        "another run folder (run_id=NAME), or resume=false to train afresh there (removing them)"
    )
    assert starting_point(run, training(resume=False), run / "checkpoints" / LAST) == (None, False)
    with pytest.raises(ConfigError, match=f"^ckpt_path={run} is a run folder of a project of the {engine} engine"):
        check_saved_run(run, LAST)
    (run / "checkpoints" / LAST).symlink_to("step")  # its own too (a folder used by both): this engine's continue
    assert starting_point(run, training(), run / "checkpoints" / LAST) == (None, True)


def training(**changes):
    """A training's config, as far as resuming reads it; `changes` by dotted key."""
    cfg = OmegaConf.create(
        {
            "ckpt_path": None,
            "resume": True,
            "strategy": {"_target_": "lightning.pytorch.strategies.DDPStrategy"},
            "model": {
                "net": {"hidden": 128, "depth": 4},
                "optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.001},
                "no_decay_norms_and_biases": True,
            },
            "seed": 42,
            "data": {
                "batch_size": 32,
                "num_workers": 0,
                "shuffle": True,
                "seed": 42,
                "dataset": {"size": 9, "dir": "a"},
            },
            "trainer": {
                "accumulate_grad_batches": 1,
                "max_epochs": 2,
                "gradient_clip_val": None,
                "precision": "32-true",
                "accelerator": "cpu",
            },
            "checkpoint": {"monitor": "val/loss"},
            "scheduler": {"_target_": "x.optimization.constant", "warmup_steps": 0},
        }
    )
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value)
    return cfg


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A run folder with a last checkpoint, written by training(); no launcher restart yet."""
    for name in (*RESTARTS, "RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last").touch()
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(training()))
    return tmp_path


@pytest.mark.parametrize("restart", RESTARTS)
def test_ckpt_path_and_resume_false_apply_to_the_first_start_only(run_dir, monkeypatch, capsys, restart):
    last = run_dir / "checkpoints" / "last"
    # Started by hand again where the run has checkpoints of its own (a stopped run says "continue with the same
    # command"): it continues them, ckpt_path= or not
    assert starting_point(run_dir, training(ckpt_path="other.ckpt"), last) == (None, True)
    assert capsys.readouterr().out == (
        "this run has checkpoints of its own: it continues from its last (ckpt_path=other.ckpt was for its first "
        "start)\n"
    )
    assert starting_point(run_dir, training(resume=False), last) == (None, False)
    monkeypatch.setenv(restart, "1")  # torchrun restarted the processes, or SLURM requeued the job
    assert starting_point(run_dir, training(ckpt_path="other.ckpt"), last) == (None, True)
    assert starting_point(run_dir, training(resume=False), last) == (None, True)
    said = capsys.readouterr().out.splitlines()
    assert said == [
        "restart 1: resuming from the run's last checkpoint (ckpt_path=other.ckpt was for the first start only)",
        "restart 1: resuming from the run's last checkpoint (resume=false was for the first start only)",
    ]
    last.unlink()  # killed before its first checkpoint: as the first start, but in the same wandb run
    assert starting_point(run_dir, training(ckpt_path="other.ckpt"), last) == ("other.ckpt", True)
    assert starting_point(run_dir, training(resume=False), last) == (None, True)
    assert capsys.readouterr().out == ""


def test_a_restart_another_machine_caused_is_a_restart_though_this_agent_did_not_count_it(
    run_dir, tmp_path_factory, monkeypatch, capsys
):
    """Two machines under torchrun, a process of the second killed: each agent counts its own processes' failures
    only, so the first machine's processes started again with TORCHELASTIC_RESTART_COUNT=0, took it for the first
    start, and resume=false wiped the checkpoints the second machine's processes were resuming from (a hang, or a
    crash and the run trained again from step 0). The agent's folder keeps the first start's mark."""
    agent_folder = tmp_path_factory.mktemp("torchelastic") / "run_abc"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(agent_folder / "attempt_0" / "0" / "error.json"))
    monkeypatch.setenv("LOCAL_RANK", "0")
    agent_folder.mkdir()
    last = run_dir / "checkpoints" / "last"
    assert starting_point(run_dir, training(resume=False), last) == (None, False), "the first start"
    assert starting_point(run_dir, training(resume=False), last) == (None, False), "the same process, again"
    (agent_folder / "started-rank0").write_text("1")  # what the first start's process (another pid) left
    assert starting_point(run_dir, training(resume=False), last) == (None, True)
    assert capsys.readouterr().out == (
        "restart 1: resuming from the run's last checkpoint (resume=false was for the first start only)\n"
    )


def test_checkpoints_of_another_training_are_refused_naming_what_differs(run_dir):
    last = run_dir / "checkpoints" / "last"
    with pytest.raises(ConfigError) as refused:
        starting_point(run_dir, training(**{"data.batch_size": 64, "model.net.hidden": 64}), last)
    message = str(refused.value)
    assert "differs from this one in data.batch_size: 32 then, 64 now; model.net.hidden: 128 then, 64 now" in message
    assert "resume=false to start afresh there" in message and "run_id=NAME for a new run folder" in message
    another_model = {f"model.net.{key}": 1 for key in "abcde"}
    with pytest.raises(ConfigError, match="model.net.c: None then, 1 now; 2 more: give resume=false"):
        starting_point(run_dir, training(**another_model), last)
    with pytest.raises(ConfigError, match="trainer.accumulate_grad_batches: 1 then, 2 now"):
        starting_point(run_dir, training(**{"trainer.accumulate_grad_batches": 2}), last)
    with pytest.raises(ConfigError, match="model.optimizer._target_: torch.optim.AdamW then, torch.optim.SGD now"):
        starting_point(run_dir, training(**{"model.optimizer._target_": "torch.optim.SGD"}), last)  # KeyError at step 1
    with pytest.raises(ConfigError, match="model._target_: None then, my_models.Regressor now"):
        starting_point(run_dir, training(**{"model._target_": "my_models.Regressor"}), last)  # a module of your own
    named = {"model._target_": "{{ cookiecutter.package_name }}.engine.module.Classifier"}  # (older layouts named it)
    assert starting_point(run_dir, training(**named), last) == (None, True)
    # The rest of the run on other data, or with optimizer settings its state would not take (and its config.yaml
    # then misreport): both were taken in silence
    with pytest.raises(ConfigError, match="model.optimizer.lr: 0.001 then, 0.01 now"):
        starting_point(run_dir, training(**{"model.optimizer.lr": 0.01}), last)
    with pytest.raises(ConfigError, match="scheduler.warmup_steps: 0 then, 2 now"):
        starting_point(run_dir, training(**{"scheduler.warmup_steps": 2}), last)
    with pytest.raises(ConfigError, match="checkpoint.monitor: val/loss then, val/acc now"):  # the best kept: by it
        starting_point(run_dir, training(**{"checkpoint.monitor": "val/acc"}), last)
    with pytest.raises(ConfigError, match="model.no_decay_norms_and_biases: True then, False now"):  # 2 groups, 1
        starting_point(run_dir, training(**{"model.no_decay_norms_and_biases": False}), last)  # (a zip() error)
    with pytest.raises(ConfigError, match="data.seed: 42 then, 1 now; seed: 42 then, 1 now"):
        starting_point(run_dir, training(**{"seed": 1, "data.seed": 1}), last)  # (the synthetic data's generator)
    with pytest.raises(ConfigError, match="data.dataset.size: 9 then, 10 now; data.shuffle: True then, False now"):
        starting_point(run_dir, training(**{"data.dataset.size": 10, "data.shuffle": False}), last)
    # What a checkpoint does not depend on may change, the preset and where the data is too (test_resume_layouts.py);
    # afresh, or from a given checkpoint, nothing is compared.
    allowed = {"trainer.max_epochs": 5, "data.num_workers": 2, "strategy": "auto", "data.dataset.dir": "moved"}
    assert starting_point(run_dir, training(**allowed), last) == (None, True)
    pipeline = {"strategy._target_": "x.strategies.pipeline.Pipe"}
    assert starting_point(run_dir, training(**pipeline), last) == (None, True)
    assert starting_point(run_dir, training(**{"data.batch_size": 64, "resume": False}), last) == (None, False)
    # A given checkpoint where the run has its own: the command that started it, run again, continues them
    assert starting_point(run_dir, training(ckpt_path="x"), last) == (None, True)
    with pytest.raises(ConfigError, match="data.batch_size: 32 then, 64 now"):
        starting_point(run_dir, training(**{"data.batch_size": 64, "ckpt_path": "x"}), last)
    with pytest.raises(ConfigError, match="scheduler._target_: x.optimization.constant then, x.optimization.cosine"):
        starting_point(run_dir, training(**{"scheduler._target_": "x.optimization.cosine"}), last)


def test_a_run_continued_with_another_clipping_says_its_steps_differ(run_dir, capsys):
    """A template update's new default, or a changed config, continued a run with clipping its first steps did not
    have, without a word (its config.yaml then holds the new value alone). A setting the run's config did not have
    yet (an older template's) is no change of the user's."""
    last = run_dir / "checkpoints" / "last"
    assert starting_point(run_dir, training(**{"trainer.gradient_clip_val": 1.0}), last) == (None, True)
    assert capsys.readouterr().out == (
        "note: trainer.gradient_clip_val: None then, 1.0 now: the steps from here train so, the ones before did not "
        "(config.yaml will hold the new values only); for the run's own, give its settings\n"
    )
    starting_point(run_dir, training(**{"trainer.gradient_clip_algorithm": "value"}), last)
    assert capsys.readouterr().out == ""
    starting_point(run_dir, training(**{"trainer.precision": "bf16-mixed"}), last)  # (lowered after an OOM)
    assert "note: trainer.precision: 32-true then, bf16-mixed now: the steps from here" in capsys.readouterr().out
    # config.yaml holds the precision used: the command's `auto` (or `32`) is no change on the CPU
    for same in ("auto", "32"):
        starting_point(run_dir, training(**{"trainer.precision": same}), last)
        assert capsys.readouterr().out == ""


def test_a_given_checkpoint_of_another_net_is_refused_before_loading(run_dir, tmp_path_factory, capsys):
    """ckpt_path= into another run folder: its config.yaml says which net wrote the checkpoint. Another net would
    fail inside the engine's loading; another batch may be fine-tuned, under another preset too."""
    checkpoint = run_dir / "checkpoints" / "step000008.ckpt"
    here = tmp_path_factory.mktemp("new_run")
    last = here / "checkpoints" / "last"
    with pytest.raises(ConfigError) as refused:
        starting_point(here, training(**{"ckpt_path": str(checkpoint), "model.net.hidden": 64}), last)
    assert str(refused.value) == (
        f"ckpt_path={checkpoint} was saved by a training that differs from this one in model.net.hidden: 128 then, "
        f"64 now: give the settings of {run_dir / 'config.yaml'}, or another checkpoint"
    )
    # (a KeyError while loading, or the learning rate of the schedule it saved)
    with pytest.raises(ConfigError, match="in scheduler._target_: x.optimization.constant then, x.optimization.cos"):
        starting_point(
            here, training(ckpt_path=str(checkpoint), **{"scheduler._target_": "x.optimization.cosine"}), last
        )
    with pytest.raises(ConfigError, match="in model.no_decay_norms_and_biases: True then, False now: give the"):
        starting_point(here, training(ckpt_path=str(checkpoint), **{"model.no_decay_norms_and_biases": False}), last)
    changes = {"data.batch_size": 64, "model.optimizer.lr": 0.1, "strategy._target_": "x.strategies.pipeline.P"}
    fine_tuned = training(ckpt_path=str(checkpoint), **changes, **{"scheduler.warmup_steps": 5})
    assert starting_point(here, fine_tuned, last) == (str(checkpoint), True)
    # The optimizer's and the schedule's states hold their settings: new ones were taken in silence, and not used
    assert capsys.readouterr().out.startswith(
        "note: model.optimizer.lr: 0.001 then, 0.1 now; scheduler.warmup_steps: 0 then, 5 now: a training continued"
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in one process, as meant
def test_a_checkpoint_of_another_net_away_from_its_run_folder_is_refused_by_its_shapes(tmp_path):
    """A checkpoint copied out of its run folder has no config.yaml to compare: another model size or model went
    on to the engine's loading, a traceback once the run folder and the wandb run were made. Each engine's formats,
    as their presets write them: Lightning's .ckpt (state_dict, "net." names) and folder of shards (DCP,
    "state_dict.net."), Accelerate's folder (model.safetensors, names as the net's; optimizer.bin beside it) and
    its folder of shards (DCP, "model.") and its layer mode's custom object file."""
    saved = ResidualMLP(32, 8, hidden=128).state_dict()
    lightning_file = tmp_path / "step000064.ckpt"
    torch.save({"epoch": 1, "state_dict": {f"net.{name}": value for name, value in saved.items()}}, lightning_file)
    accelerate_folder = tmp_path / "step-0000064"
    accelerate_folder.mkdir()
    save_file({name: value.contiguous() for name, value in saved.items()}, accelerate_folder / "model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": []}, accelerate_folder / "optimizer.bin")
    lightning_shards, accelerate_shards = tmp_path / "step000008.ckpt", tmp_path / "step-0000008"
    dcp.save({"state_dict": {"net": saved}}, checkpoint_id=lightning_shards)
    dcp.save({"model": saved}, checkpoint_id=accelerate_shards / "sharded")
    layers = tmp_path / "step-0000004"  # model_parallel's layer mode: the net in accelerate's custom object file
    layers.mkdir()
    torch.save({"global_step": 4}, layers / "custom_checkpoint_0.pkl")
    torch.save({"model": saved, "optimizer": {"state": {}}}, layers / "custom_checkpoint_1.pkl")
    for checkpoint in (lightning_file, accelerate_folder, lightning_shards, accelerate_shards, layers):
        check_same_shapes(checkpoint, ResidualMLP(32, 8, hidden=128))  # the same net: taken
        with pytest.raises(ConfigError) as refused:
            check_same_shapes(checkpoint, ResidualMLP(32, 8, hidden=64))
        assert str(refused.value).startswith(f"ckpt_path={checkpoint} holds tensors of other sizes than this net's (")
        assert str(refused.value).endswith(
            "more): it was trained with other model settings; give those (its run's config.yaml has them), or "
            "another checkpoint"
        )
        with pytest.raises(ConfigError, match=r"holds \d of this net's \d+ tensors \(.*: it is another model's; give"):
            check_same_shapes(checkpoint, GPT(vocab_size=50, max_seq_len=16))
    with pytest.raises(ConfigError, match=r"\(embed.weight: \[128, 32\] there, \[64, 32\] here; "):
        check_same_shapes(lightning_file, ResidualMLP(32, 8, hidden=64))


def test_a_checkpoint_resumes_on_any_mesh_but_not_with_another_tensor_parallel_size(tmp_path):
    """The optimizer's parameter groups, and the schedule's state, follow the tensor-parallel layout alone."""
    whole = tmp_path / "step000004.ckpt"  # a whole-model file: no tensor parallelism, no mesh recorded
    whole.touch()
    check_same_mesh(whole, 4, 1, "fsdp")  # ddp -> FSDP over 4, say
    with pytest.raises(ConfigError) as refused:
        check_same_mesh(whole, 1, 2, "model_parallel")
    assert str(refused.value).startswith(f"{whole} was saved without tensor parallelism, this run's tensor-parallel")
    shards = tmp_path / "step000008.ckpt"
    shards.mkdir()
    write_mesh(shards, 2, 2, "model_parallel")
    check_same_mesh(shards, 2, 2, "model_parallel")
    for other in [(4, 1), (1, 4)]:
        with pytest.raises(ConfigError, match="on a mesh of 2 data-parallel x 2 tensor-parallel processes"):
            check_same_mesh(shards, *other, "model_parallel")
    with pytest.raises(ConfigError, match="processes\\), or start from another checkpoint, or none$"):
        check_same_mesh(shards, 4, 1, "model_parallel", given=True)  # (ckpt_path=: resume=false keeps it)
    with pytest.raises(
        ConfigError, match="saved by strategy=model_parallel with strategy.tensor_parallel_size=2, this"
    ):
        check_same_mesh(shards, 2, 2, "pipeline")  # the same sizes, other parameter groups
    write_mesh(shards, 2, 2, "pipeline")  # 2 pipelines of stages sharded over 2: any number of pipelines
    check_same_mesh(shards, 1, 2, "pipeline")
    with pytest.raises(ConfigError, match="resume it under strategy=pipeline strategy.tensor_parallel_size=2"):
        check_same_mesh(shards, 1, 1, "ddp")
    write_mesh(shards, 2, 1, "fsdp")  # FSDP over 2
    check_same_mesh(shards, 4, 1, "pipeline")


def cut_short(path, keep=100):
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save in one process, as meant
def test_a_damaged_checkpoint_is_refused_naming_the_newest_whole_one(run_dir, tmp_path_factory):
    """A checkpoint's files cut short (a copy that stopped, a full disk), in each form the engines write: torch.save's
    file (Lightning's .ckpt, accelerate's optimizer.bin), a safetensors file (accelerate's net), a DCP folder (the
    sharding presets'). Each written for real, then damaged; the refusal names the damage and the way on."""
    folder, state = run_dir / "checkpoints", {"weight": torch.randn(64, 64)}
    older, newer = folder / "step000004.ckpt", folder / "step000008.ckpt"
    torch.save(state, older)
    torch.save(state, newer)
    os.utime(older, (1, 1))  # written first
    (folder / "last").unlink()
    (folder / "last").symlink_to(newer.name)
    assert starting_point(run_dir, training(), folder / "last") == (None, True)  # whole: resumed
    (folder / "notes.txt").write_text("not a checkpoint, and newer than any")  # never suggested
    torch.save(state, folder / "weights.pt")  # nor weights of another kind (ckpt_path= refuses weights alone)
    (folder / ".step000012.partial").mkdir()  # nor one being written
    (folder / ".step000012.partial" / "model.safetensors").write_bytes(b"")
    cut_short(newer)
    with pytest.raises(ConfigError) as refused:
        starting_point(run_dir, training(), folder / "last")
    assert str(refused.value) == (
        f"the run's last checkpoint {newer} cannot be read: cut short (its zip directory is missing); continue from "
        f"its newest whole one with ckpt_path={older}, or start afresh with resume=false"
    )
    elsewhere = tmp_path_factory.mktemp("new_run")
    with pytest.raises(ConfigError, match=f"give another checkpoint \\(the newest whole one beside it: {older}\\)$"):
        starting_point(elsewhere, training(ckpt_path=str(newer)), elsewhere / "checkpoints" / "last")

    parts = tmp_path_factory.mktemp("dcp") / "step000012"
    dcp.save(state, checkpoint_id=parts)  # one process: no process group needed
    starting_point(elsewhere, training(ckpt_path=str(parts)), elsewhere / "checkpoints" / "last")
    (data,) = parts.glob("*.distcp")
    cut_short(data)
    with pytest.raises(ConfigError, match=f"\\.metadata: places \\d+ bytes in {data.name}, which has 100: cut short"):
        starting_point(elsewhere, training(ckpt_path=str(parts)), elsewhere / "checkpoints" / "last")
    data.unlink()
    with pytest.raises(
        ConfigError, match=f"\\.metadata: names {data.name}, which is missing; give another checkpoint$"
    ):
        starting_point(elsewhere, training(ckpt_path=str(parts)), elsewhere / "checkpoints" / "last")
    # Its index missing (DCP's "metadata is None" traceback), in a subfolder as accelerate's sharded/ too; a Lightning
    # folder (.ckpt) without the meta.pt beside its shards (a FileNotFoundError)
    lightning_like = tmp_path_factory.mktemp("lightning") / "step000016.ckpt"
    dcp.save(state, checkpoint_id=lightning_like)
    with pytest.raises(ConfigError, match=r"cannot be read: no meta.pt \(the training's state beside the shards\)"):
        starting_point(elsewhere, training(ckpt_path=str(lightning_like)), elsewhere / "checkpoints" / "last")
    sharded = tmp_path_factory.mktemp("sharded") / "step-0000016"
    dcp.save(state, checkpoint_id=sharded / "sharded")
    (sharded / "sharded" / ".metadata").unlink()
    with pytest.raises(ConfigError, match=r"cannot be read: sharded: 1 shard files but no \.metadata \(their index\)"):
        starting_point(elsewhere, training(ckpt_path=str(sharded)), elsewhere / "checkpoints" / "last")

    accelerate_like = tmp_path_factory.mktemp("folder") / "step-0000016"
    accelerate_like.mkdir()
    save_file(state, accelerate_like / "model.safetensors")
    torch.save(state, accelerate_like / "optimizer.bin")
    starting_point(elsewhere, training(ckpt_path=str(accelerate_like)), elsewhere / "checkpoints" / "last")
    cut_short(accelerate_like / "model.safetensors", keep=200)
    (accelerate_like.parent / "copy.log").write_text("beside it, no checkpoint")
    with pytest.raises(
        ConfigError, match="model.safetensors: not a whole safetensors file.*; give another checkpoint$"
    ):
        starting_point(elsewhere, training(ckpt_path=str(accelerate_like)), elsewhere / "checkpoints" / "last")
    save_file(state, accelerate_like / "model.safetensors")
    # Emptied, or cut to its first byte: an EOFError's traceback, or accelerate's random states skipped unsaid
    for kept, problem in ((0, "empty"), (1, "cut short"), (None, "not written by torch.save")):
        torch.save(state, accelerate_like / "optimizer.bin")
        cut_short(accelerate_like / "optimizer.bin", keep=kept)
        if kept is None:  # another program's file in its place
            (accelerate_like / "optimizer.bin").write_text('{"lr": 0.001}')
        with pytest.raises(ConfigError, match=f"optimizer.bin: {problem}"):
            starting_point(elsewhere, training(ckpt_path=str(accelerate_like)), elsewhere / "checkpoints" / "last")


def test_how_to_continue_is_said_only_where_a_checkpoint_was_saved(tmp_path):
    """Ctrl-C while a training starts, or a process killed, before the first checkpoint: "continue ... from its last
    checkpoint" named none (and run_id=last another run's). Either engine's checkpoints count: Lightning's files
    (its `last.ckpt` a link to one), Accelerate's folders."""
    assert continuing("r", tmp_path) == "it saved no checkpoint to continue from; run the command again to start over"
    (tmp_path / "checkpoints").mkdir()
    assert continuing("r", tmp_path).startswith("it saved no checkpoint")
    torch.save({"step": 4}, tmp_path / "checkpoints" / "step000004.ckpt")
    (tmp_path / "checkpoints" / "last.ckpt").symlink_to("step000004.ckpt")
    assert continuing("r", tmp_path).endswith("plus run_id=r (or run_id=last), from its last checkpoint")
    folders = tmp_path / "accelerate"
    (folders / "checkpoints" / "step-0000004").mkdir(parents=True)
    torch.save({"step": 4}, folders / "checkpoints" / "step-0000004" / "optimizer.bin")
    assert continuing("r", folders).endswith("from its last checkpoint")


def test_run_id_last_looks_in_the_experiment_hydra_uses(tmp_path, monkeypatch):
    """Given twice (a launch script's `experiment=` before the user's), Hydra takes the last `experiment=`; a recipe
    of yours may set it (run_id=last looked in outputs/default/, and continued another run there)."""
    monkeypatch.chdir(tmp_path)
    for experiment in ("script", "mine", "default"):
        (tmp_path / "outputs" / experiment / f"{experiment}-run" / "checkpoints").mkdir(parents=True)
    argv = ["experiment=script", "run_id=last", "experiment=mine"]
    assert continue_last(argv, composed_experiment(argv, "train")) == [*argv[:1], "run_id=mine-run", *argv[2:]]
    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    (configs / "recipe").mkdir(exist_ok=True)
    (configs / "recipe" / "cnn.yaml").write_text("# @package _global_\nexperiment: mine\n")
    monkeypatch.setattr(config_overrides, "CONFIG_DIR", configs)  # (where the command's config is read from)
    assert composed_experiment(["+recipe=cnn", "run_id=last"], "train") == "mine"
    assert composed_experiment(["+recipe=cnn", "experiment=script"], "train") == "script"
    assert composed_experiment(["run_id=last"], "train") == "default"
    (tmp_path / "best.yaml").write_text("defaults:\n- train\n- _self_\nexperiment: study\n")  # a search's
    assert composed_experiment(["--config-dir", str(tmp_path), "--config-name", "best", "run_id=last"], "train") == (
        "study"
    )


def test_a_run_trained_to_its_end_says_so_and_one_past_it_is_refused(tmp_path):
    """The same command again after a run finished resumed and trained nothing, without a word (exit 0, as a job
    restarted after its end must): it says so now. Past the end (fewer epochs or steps asked) is refused."""
    last = tmp_path / "last"
    assert check_not_past_the_end(last, 1, 10, 2, -1) is None  # more to train
    assert check_not_past_the_end(last, 1, 10, 3, -1, given=True) == (  # ckpt_path=: its test is of other weights
        "note: last has trained 10 steps; this run trains it on to trainer.max_epochs=3 before its test: to test it "
        "as it is, give trainer.max_steps=10"
    )
    assert check_not_past_the_end(last, 1, 10, 3, -1, given=True, tested=False) is None  # test_after_fit=false
    note = check_not_past_the_end(last, 2, 20, 2, -1)
    assert note == (
        "note: this run has trained to trainer.max_epochs=2 already (20 steps): nothing left to train; to train it "
        "further, raise the limit (its learning-rate schedule keeps the length it was made for)"
    )
    assert "trainer.max_steps=20 already" in check_not_past_the_end(last, 1, 20, -1, 20)
    with pytest.raises(ConfigError, match="has trained 2 epochs \\(20 steps\\), past trainer.max_epochs=1"):
        check_not_past_the_end(last, 2, 20, 1, -1)


def test_a_run_continued_for_longer_says_its_cosine_schedule_keeps_its_length(tmp_path):
    """Raising trainer.max_steps to train a finished run further went on at the cosine schedule's floor, unsaid."""
    cosine = {"_target_": "{{ cookiecutter.package_name }}.runtime.optimization.cosine", "warmup_steps": 1}
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(training(**{"trainer.max_steps": 3, "scheduler": cosine})))
    saved = tmp_path / "config.yaml"
    assert schedule_length_note(saved, training(**{"trainer.max_steps": 3, "scheduler": cosine})) is None
    assert schedule_length_note(saved, training(**{"trainer.max_steps": 6, "scheduler": cosine})) == (
        "note: trainer.max_steps: 3 then, 6 now: the run's cosine schedule keeps the span it was made for (its decay "
        "ends by the old length, or a step after a warmup longer than that, and the steps after it train at its "
        "floor, lr x scheduler.min_lr_ratio); for one over the new length, train afresh (resume=false; from a "
        "checkpoint's weights: docs/your-model.md, pretrained weights)"
    )
    constant = {**cosine, "_target_": "{{ cookiecutter.package_name }}.runtime.optimization.constant"}
    assert schedule_length_note(saved, training(**{"trainer.max_steps": 6, "scheduler": constant})) is None


def test_a_write_that_found_the_disk_full_is_told_from_other_failures(tmp_path):
    """A checkpoint's write on a full disk ended in torch's or safetensors' traceback (60 lines, naming no disk): the
    training says so in one line (train.py); what else fails stays a crash."""
    assert out_of_space(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert out_of_space(
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"), tmp_path
    )
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as quota:
            raise RuntimeError("the save failed") from quota
    except RuntimeError as wrapped:
        assert out_of_space(wrapped, tmp_path)
    # torch.save's words for a short write, with room on the disk: not a full disk
    assert not out_of_space(RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 64"), tmp_path)
    assert not out_of_space(OSError(errno.EACCES, "Permission denied"), tmp_path)


def test_a_file_the_user_may_not_open_is_named_from_any_library_s_error(tmp_path):
    """Another user's checkpoints folder (a shared cluster account) ended in torch's, fsspec's or safetensors'
    traceback: the training names the file in one line (train.py); other failures stay crashes."""
    saved = tmp_path / "checkpoints" / "last.ckpt"
    assert permission_denied(PermissionError(errno.EACCES, "Permission denied", str(saved)), tmp_path) == saved
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", str(saved))
        except OSError as read_only:
            raise RuntimeError("the save failed") from read_only
    except RuntimeError as wrapped:
        assert permission_denied(wrapped, tmp_path) == saved
    safetensors_words = 'Error while serializing: IoError(Os { code: 13, kind: PermissionDenied, message: "x" })'
    assert permission_denied(RuntimeError(safetensors_words), tmp_path) == tmp_path
    # torch.save's words, in a folder this user may write (or none): not a permission (a path too long, say)
    assert permission_denied(RuntimeError(f"File {saved} cannot be opened."), tmp_path) is None
    saved.parent.mkdir()
    assert permission_denied(RuntimeError(f"File {saved} cannot be opened."), tmp_path) is None
    assert permission_denied(OSError(errno.ENOSPC, "No space left on device"), tmp_path) is None
