"""The optimisation settings, the same in both engines: parameter groups, the learning-rate schedule (logged as
train/lr), trainer.accumulate_grad_batches inside the global batch, and BatchNorm under data parallelism."""

import copy
import math
import os
import shutil
import signal
import time
import warnings
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import PARITY, QUICK, TOLERANCE, K, unsplit_net
from engine_specific import DDP, OPTIMIZATION_REFUSALS, best_step, launcher_of, optimizer_of, step_checkpoint
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from {{ cookiecutter.package_name }}.config import CONFIG_DIR
from {{ cookiecutter.package_name }}.config.groups import check_group_choices
from {{ cookiecutter.package_name }}.config.objects import register_resolvers
from {{ cookiecutter.package_name }}.config.overrides import check_overrides
from {{ cookiecutter.package_name }}.config.settings import check_strategy_settings
from {{ cookiecutter.package_name }}.errors import ConfigError, Interrupted
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.batchnorm import SynchronisedBatchNorm, accumulation_note, unsynchronised_note
from {{ cookiecutter.package_name }}.parallel.sharding import clip_grad_norm_, clip_grad_value_
from {{ cookiecutter.package_name }}.parallel.split import find_split
from {{ cookiecutter.package_name }}.runtime.interrupt import ending_limit, stops_at_once
from {{ cookiecutter.package_name }}.runtime.optimization import (
    check_training_length,
    constant,
    cosine,
    grouped_optimizer,
    respan,
)


@pytest.mark.parametrize("norm", ["layer", "batch"])
def test_norms_and_biases_are_not_decayed(norm):
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2, norm=norm)
    optimizer = grouped_optimizer(torch.optim.AdamW, net.parameters(), no_decay_norms_and_biases=True)
    decayed = {id(p) for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}
    for name, param in net.named_parameters():
        is_norm_or_bias = name.endswith("bias") or ".norm." in f".{name}"
        assert (id(param) not in decayed) == is_norm_or_bias, name
    plain = grouped_optimizer(torch.optim.AdamW, net.parameters(), no_decay_norms_and_biases=False)
    assert len(plain.param_groups) == 1 and plain.param_groups[0]["weight_decay"] > 0


def test_the_optimizer_is_fused_as_the_config_says():
    """model.optimizer.fused (default true: one kernel for every parameter), through the code that builds the run's
    optimizer; null leaves torch's choice."""
    register_resolvers()
    for overrides, fused in [([], True), (["model.optimizer.fused=null"], None)]:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
        optimizer = optimizer_of(cfg, ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=1))
        assert [group["fused"] for group in optimizer.param_groups] == [fused, fused]


@pytest.fixture
def one_process_group():
    """A process group of this process alone (gloo), for tensor-parallel shards without launching processes."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("optimizer", [torch.optim.AdamW, partial(torch.optim.SGD, lr=0.1, momentum=0.9)])
def test_fused_steps_and_clipping_take_shards_next_to_plain_parameters(one_process_group, optimizer):
    """Tensor parallel makes the blocks' weights shards (DTensors) and leaves the other layers plain tensors: the
    fused and foreach optimizer kernels and torch's clipping refuse such a mix, and SGD's fused kernel takes no
    shards at all. The optimizer's groups keep the kinds apart (shards step with foreach kernels), clipping takes
    each kind in turn, and the steps are those of the same net unsharded."""
    torch.manual_seed(0)
    nets = [ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    mesh = init_device_mesh("cpu", (1,))
    parallelize_module(nets[1], mesh, dict(find_split(nets[1], "model_parallel")[1].tensor_parallel))
    assert isinstance(nets[1].blocks[0].fc_in.weight, DTensor) and not isinstance(nets[1].head.weight, DTensor)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    for clip_by in ("value", "norm"):
        for net, clip_value, clip_norm in [(nets[0], torch.nn.utils.clip_grad_value_, torch.nn.utils.clip_grad_norm_),
                                           (nets[1], clip_grad_value_, clip_grad_norm_)]:  # fmt: skip
            built = grouped_optimizer(partial(optimizer, fused=True), net.parameters(), True)
            F.cross_entropy(net(x), y).backward()
            if clip_by == "value":
                clip_value(net.parameters(), 1e-3)
            else:
                clip_norm(net.parameters(), 1e-2)
            built.step()
            built.zero_grad()
    sharded = {name: value.full_tensor() if isinstance(value, DTensor) else value
               for name, value in nets[1].state_dict().items()}  # fmt: skip
    for name, value in nets[0].state_dict().items():
        assert torch.allclose(sharded[name], value, atol=1e-6), name


def expected_cosine(step: int, lr: float, warmup: int, total: int, ratio: float) -> float:
    """The schedule as configs/scheduler/cosine.yaml describes it: linear from lr / warmup to lr, then a cosine
    from lr at step `warmup` down to lr x ratio at the training's last step (total - 1)."""
    if step < warmup:
        return lr * (1 / warmup + (1 - 1 / warmup) * step / warmup)
    floor = lr * ratio
    return floor + (lr - floor) * (1 + math.cos(math.pi * (step - warmup) / (total - 1 - warmup))) / 2


@pytest.mark.slow
def test_the_cosine_schedule_spans_the_epochs_optimizer_steps(train):
    """One epoch of 672 samples in global batches of 64, each 2 accumulated micro-batches: 10 optimizer steps (the
    half batch left over is not trained), and the schedule warms up over 3 of them and ends at its floor. (No step
    limit given as null, as the docs allow: both engines failed on it, Lightning's Trainer and the Accelerate loop.)"""
    run = train(
        *QUICK,
        "trainer.max_steps=null",
        "trainer.accelerator=cpu",
        "data.train_size=672",
        "data.batch_size=64",
        "trainer.accumulate_grad_batches=2",
        "model.optimizer.lr=0.01",
        "scheduler=cosine",
        "scheduler.warmup_steps=3",
        "scheduler.min_lr_ratio=0.1",
    )
    assert run.wandb.steps("train/lr") == list(range(10))
    expected = [expected_cosine(step, 0.01, 3, 10, 0.1) for step in range(10)]
    assert run.wandb.metric("train/lr") == pytest.approx(expected, rel=1e-6)
    assert run.wandb.metric("train/lr")[-1] == pytest.approx(0.001, rel=1e-6)  # the last step at the floor


def test_the_cosine_schedule_stays_at_its_floor_past_its_span():
    """A training resumed with more steps than it was planned for keeps the schedule it saved: past its span the
    learning rate stays at the floor (torch's cosine would climb back to lr), through a save and a load too. Each
    parameter group decays from its own lr to its own floor (torch's one floor made a smaller lr climb to it)."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    # a second group with a learning rate of its own (a backbone fine-tuned more gently) decays to its own floor
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.0001})
    schedule = cosine(optimizer, total_steps=10, warmup_steps=3, min_lr_ratio=0.1)
    lrs, gentle = [], []
    for step in range(30):
        lrs.append(optimizer.param_groups[0]["lr"])
        gentle.append(optimizer.param_groups[1]["lr"])
        optimizer.step()
        schedule.step()
        if step == 15:  # a resume past the span, into a schedule built for a longer training
            saved = copy.deepcopy((optimizer.state_dict(), schedule.state_dict()))
            schedule = cosine(optimizer, total_steps=40, warmup_steps=3, min_lr_ratio=0.1)
            optimizer.load_state_dict(saved[0])
            schedule.load_state_dict(saved[1])
    assert lrs[:10] == pytest.approx([expected_cosine(step, 0.01, 3, 10, 0.1) for step in range(10)], rel=1e-6)
    assert lrs[10:] == pytest.approx([0.001] * 20, rel=1e-6)
    assert gentle == pytest.approx([lr / 100 for lr in lrs], rel=1e-6)


@pytest.mark.parametrize("schedule", [constant, cosine])
def test_a_warmup_longer_than_the_training_is_not_shortened(schedule):
    """warmup_steps=10 in a training of 2 steps: lr / 10, then 2 x lr / 10, as the settings say (it was shortened
    to the training's length without a word, starting at lr / 2)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    steps = schedule(optimizer, total_steps=2, warmup_steps=10)
    lrs = []
    for _ in range(2):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        steps.step()
    assert lrs == pytest.approx([expected_cosine(step, 1.0, 10, 2, 0.1) for step in range(2)]) == [0.1, 0.19]


def test_a_schedule_made_shorter_than_its_warmup_by_the_batch_size_search_is_said(capsys):
    """The batch-size search made 64 steps 8 (a batch 8 times larger): a warmup of 10 then spans them all, and the
    learning rate never reached its peak, without a word."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    build = partial(cosine, warmup_steps=10, min_lr_ratio=0.1)
    respan(build(optimizer, total_steps=5), build, 5)  # short as configured (Lightning builds it again each fit)
    respan(build(optimizer, total_steps=5), build, 8)  # a smaller batch found: more steps, not the search's doing
    assert "note:" not in capsys.readouterr().err
    respan(build(optimizer, total_steps=64), build, 8)
    said = "note: scheduler.warmup_steps=10 spans the whole training, now 8 optimizer steps (the batch-size search"
    assert said in capsys.readouterr().err


def test_ctrl_c_during_the_batch_size_search_stops_at_once_in_one_line():
    """Before the first step there is nothing to save: the search stops at once (exit 130), also where SIGINT was
    ignored when the process started (a background job), which left the search and the training to run to the end."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(Interrupted, match="interrupted during the batch-size search, before the first step"):
            with stops_at_once("the batch-size search"):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # (the signal is handled between two bytecodes)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "the handler before is back"
    finally:
        signal.signal(signal.SIGINT, previous)


# (overrides, the one error line); each refused before training (conftest's `refused` runs them)
CUSTOM_DATA = [
    "data=custom",
    "+data.dataset.size=64",
    "data.num_features=6",
    "data.num_classes=2",
    "data.batch_size=32",
]
BAD_INPUT = [
    (
        ["strategy=ddp_spawn", "trainer.devices=2", "data.batch_size=64", "trainer.accumulate_grad_batches=3"],
        "data.batch_size=64 is the global batch = micro-batch x trainer.accumulate_grad_batches=3 x 2 "
        "data-parallel replicas, so a positive multiple of 6; nearest valid: 60 or 66",
    ),
    (
        ["strategy=ddp_spawn", "trainer.devices=2", "trainer.accelerator=cpu", "model.net.norm=batch", "oom=toolkit"],
        "cannot run with BatchNorm synchronised over the processes",
    ),
    (  # one process, BatchNorm not synchronised: a split step would still normalise each micro-batch alone
        ["strategy=single", "trainer.accelerator=cpu", "model.net.norm=batch", "oom=toolkit"],
        "oom.recovery.policy=split cannot keep the optimisation with BatchNorm",
    ),
    (
        ["strategy=dp", "trainer.devices=2", "activation_checkpointing=full"],
        "strategy=dp does not support activation_checkpointing: nn.DataParallel copies the net",
    ),
    (["activation_checkpointing=some"], "activation_checkpointing=some is unknown; valid: none, full, selective"),
    (
        ["activation_checkpointing=full", *unsplit_net()],
        "activation_checkpointing=full recomputes each block of the model's Split, and Sequential has none",
    ),
    (["float8=fp4"], "float8=fp4 is unknown; valid: none, tensorwise, rowwise"),
    (
        ["trainer.accelerator=cpu", "float8=rowwise"],
        "float8=rowwise needs GPUs with float8 tensor cores (compute capability 8.9+: H100, H200, L40S); this run "
        "has no GPU: leave float8=none",
    ),
    (
        ["strategy=dp", "float8=tensorwise"],
        "float8=tensorwise runs under strategy=single|ddp|ddp_spawn|fsdp|model_parallel (model_parallel with "
        "tensor_parallel_size=1, FSDP2), not strategy=dp",
    ),
    (
        ["strategy=ddp", "trainer.devices=2", "checkpoint.async=true"],
        "checkpoint.async=true writes the parts each process holds of a sharded checkpoint (strategy=fsdp, "
        "model_parallel over several processes, pipeline); strategy=ddp here saves the whole model from one process: "
        "give checkpoint.async=false",
    ),
    (["checkpoint.async=sometimes"], "checkpoint.async=sometimes is not true or false (the default is false)"),
    (  # the key exists in fsdp's config only: added with +, it must not be taken in silence
        ["strategy=pipeline", "trainer.devices=2", "+strategy.replicas=2"],
        "strategy=pipeline has no strategy.replicas; its settings: data_parallel_size, microbatches,",
    ),
    (  # was a traceback inside the processes (Lightning hands DDPStrategy's extra arguments to torch's DDP)
        ["strategy=ddp", "trainer.devices=2", "+strategy.replicas=2"],
        "strategy=ddp has no strategy.replicas; its settings:",
    ),
    (  # was "got multiple values for keyword argument" (fsdp is model_parallel's class with a size of 1)
        ["strategy=fsdp", "trainer.devices=2", "+strategy.tensor_parallel_size=2"],
        "strategy=fsdp has no strategy.tensor_parallel_size; its settings: init, offload, replicas,",
    ),
    (
        ["strategy=pipeline", "trainer.devices=2", "strategy.schedule=1f1b", "strategy.stages_per_process=2"],
        "strategy.stages_per_process=2 does not fit strategy.schedule=1f1b; valid: 1 (interleaved_1f1b and zbv run "
        "more)",
    ),
    (
        ["strategy=pipeline", "trainer.devices=2", "strategy.schedule=zbv", "compile=true"],
        "strategy.schedule=zbv splits each backward in two, which a compiled block cannot; give compile=false, or "
        "strategy.schedule=interleaved_1f1b",
    ),
    (  # torch's traceback at the first step ("Trying to backward an extra time")
        ["strategy=pipeline", "trainer.devices=2", "strategy.schedule=zbv", "activation_checkpointing=selective"],
        "strategy.schedule=zbv splits each backward in two, which torch's selective activation checkpointing cannot",
    ),
    (
        ["trainer.accumulate_grad_batches=0"],
        "trainer.accumulate_grad_batches=0 must be 1 or more (micro-batches per step)",
    ),
    (["data.num_workers=-1"], "data.num_workers=-1 is not a number of loader processes; valid: 0, 1, ... or auto"),
    (
        [*CUSTOM_DATA, "data.dataset._target_=custom_dataset.Parity", "data.prefetch_factor=0"],
        "data.prefetch_factor=0 must be 1 or more (batches each worker prepares ahead)",
    ),
    (  # it trained no step, exit 0
        [*CUSTOM_DATA, "data.dataset._target_=custom_dataset.Parity", "data.batch_size=128"],
        "the training split has 64 samples, fewer than one global batch (data.batch_size=128): no step would train",
    ),
    (
        [*CUSTOM_DATA, "data.dataset._target_=custom_dataset.DictItems"],
        "data.dataset DictItems: an item is dict, but the training takes (x, y) pairs: return x, y from __getitem__",
    ),
    # Taken in silence before: gradient ascent, a learning rate above lr; or a traceback at the first step.
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val=-1 is not a gradient norm: give the largest norm"),
    (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps=0: give 1 or more (train/loss every that many"),
    (["trainer.gradient_clip_algorithm=scale"], "trainer.gradient_clip_algorithm=scale: give norm or value"),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0: give 1 or more, or -1 (null) for no limit of that kind"),
    (["trainer.max_epochs=-1"], "trainer.max_epochs and trainer.max_steps set no end"),  # LinearLR's traceback
    (["checkpoint.every_n_steps=-3"], "checkpoint.every_n_steps=-3: give 1 or more"),
    (["scheduler.warmup_steps=-1"], "scheduler.warmup_steps=-1: give a number of optimizer steps, 0 or more"),
    (["scheduler.min_lr_ratio=2"], "scheduler.min_lr_ratio=2: the last step's learning rate as a share of model."),
    (
        ["model.optimizer._target_=torch.optim.RMSprop"],
        "model.optimizer: RMSprop.__init__() got an unexpected keyword argument 'fused'; drop the argument with "
        "~model.optimizer.fused, or give one the class takes",
    ),
    (["model.optimizer.weight_decay=-0.1"], "model.optimizer: Invalid weight_decay value: -0.1"),
    (  # a traceback (Lightning), or every step taken twice (Accelerate, for a schedule returning the optimizer)
        [
            "scheduler._target_=own_models.schedule_without_its_return",
            "~scheduler.warmup_steps",
            "~scheduler.min_lr_ratio",
        ],
        "scheduler: schedule_without_its_return(optimizer, total_steps=N) returned NoneType, not a learning-rate",
    ),
    *OPTIMIZATION_REFUSALS,
]
CASE_NAMES = [
    "indivisible-accumulation",
    "oom-recovery-with-synchronised-batchnorm",
    "oom-split-with-batchnorm",
    "activation-checkpointing-under-dp",
    "unknown-activation-checkpointing",
    "activation-checkpointing-without-split",
    "unknown-float8",
    "float8-without-a-float8-gpu",
    "float8-under-dp",
    "async-checkpoints-of-a-whole-model",
    "async-checkpoints-not-a-boolean",
    "an-fsdp-setting-in-a-pipeline",
    "an-fsdp-setting-under-ddp",
    "a-model-parallel-setting-under-fsdp",
    "stages-per-process-of-a-one-stage-schedule",
    "zbv-compiled",
    "zbv-selectively-recomputed",
    "no-micro-batch-per-step",
    "negative-loader-workers",
    "no-batch-prepared-ahead",
    "a-split-smaller-than-a-batch",
    "items-that-are-not-pairs",
    "negative-gradient-clipping",
    "logging-every-0-steps",
    "unknown-clipping-algorithm",
    "no-epoch",
    "no-end",
    "checkpoints-every-negative-steps",
    "negative-warmup",
    "learning-rate-floor-above-1",
    "optimizer-without-fused",
    "negative-weight-decay",
    "schedule-not-returned",
    "batchnorm-under-pipeline",
    "hsdp-replicas-that-do-not-divide-the-data-parallel-size",
]


@pytest.mark.parametrize("preset", ["ddp", "ddp_spawn"])
def test_ddp_takes_the_options_of_torchs_ddp_but_no_other_added_setting(preset):
    """torch's DistributedDataParallel's options stay open (+strategy.static_graph=true) in both engines: Lightning's
    DDPStrategy hands them on, and the Accelerate engine's DDP those accelerate passes on (it refused them). Anything
    else is refused before the run folder; the pipeline passes none on."""
    ddp = OmegaConf.load(CONFIG_DIR / "strategy" / f"{preset}.yaml").strategy
    check_strategy_settings(preset, ddp, ["strategy.static_graph", "strategy.gradient_as_bucket_view"])
    with pytest.raises(ConfigError, match=f"strategy={preset} has no strategy.replicas; its settings: "):
        check_strategy_settings(preset, ddp, ["strategy.replicas"])
    pipeline = OmegaConf.load(CONFIG_DIR / "strategy" / "pipeline.yaml").strategy
    with pytest.raises(ConfigError, match="strategy=pipeline has no strategy.find_unused_parameters"):
        check_strategy_settings("pipeline", pipeline, ["strategy.find_unused_parameters"])


def test_accumulation_with_batchnorm_is_said():
    """Not refused (vision models do it), but not the whole batch's optimisation: said in one line."""
    batchnorm, layernorm = (ResidualMLP(8, 2, hidden=8, depth=1, norm=norm) for norm in ("batch", "layer"))
    assert "each micro-batch is normalised by its own statistics" in accumulation_note(batchnorm, 2)
    assert accumulation_note(batchnorm, 1) is None and accumulation_note(layernorm, 2) is None
    # ddp with trainer.sync_batchnorm=false: each process's share of the batch (a user's ResNet, 1.6e-3 off single)
    assert "over 2 processes: each normalises by its share" in unsynchronised_note(batchnorm, 2)
    assert unsynchronised_note(batchnorm, 1) is None and unsynchronised_note(layernorm, 2) is None


def test_what_the_checks_take_as_lightning_does():
    """Lightning's "no limit" (null or -1) for one of the two ends, 0 or null for no step checkpoints, `auto`
    loader workers where the default is a number, a wandb argument removed with ~ (both engines), and a key of a dict
    argument (model.net.config of model=causal_lm: a Llama key gpt2 does not take) too."""
    for ends in [(None, 5, None), (-1, 5, 0), (3, None, 500), (3, -1, 1)]:
        check_training_length(*ends)
    check_overrides(["data.num_workers=auto", "~logger.group"], "train")
    check_overrides(["model=causal_lm", "~model.net.config.intermediate_size"], "train")


def test_a_setting_of_a_part_that_is_off_is_noted():
    """Taken without a word and never read (the run looked like it had used it): a note. Not a refusal: a search
    whose space turns the finder on and off gives every trial the setting; the bench turns the finder on itself."""
    finder_off = (
        r"^oom.batch_size_finder.max_batch_size is not read: only the batch-size search reads it, and "
        r"oom.find_batch_size is false here \(oom.find_batch_size=true turns it on\)$"
    )
    with pytest.warns(UserWarning, match=finder_off):
        check_overrides(["oom=toolkit", "oom.batch_size_finder.max_batch_size=64"], "train")
    with pytest.warns(UserWarning, match="only strategy.mode=tensor reads it, and strategy.mode is layers here"):
        check_overrides(["strategy=model_parallel", "strategy.mode=layers", "strategy.tensor_parallel_size=4"], "train")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_overrides(["oom.find_batch_size=true", "oom.batch_size_finder.max_batch_size=64"], "train")
        check_overrides(["-m", "oom.find_batch_size=true,false", "oom.batch_size_finder.max_batch_size=64"], "train")
        check_overrides(["oom.batch_size_finder.margin=0.5"], "bench")


def test_a_typo_is_told_its_setting_and_a_finished_run_the_limit_that_ended_it(tmp_path):
    """A newcomer's: a close match is the hint, not a key to add (Trainer takes no new key) nor the key's own node
    (doctor.foo: "did you mean doctor?"); run_id=last on a run trainer.max_steps ended names max_steps."""
    with pytest.raises(ConfigError, match=r"^unknown setting trainer.max_epoch; did you mean trainer.max_epochs\?$"):
        check_overrides(["trainer.max_epoch=2"], "train")
    with pytest.raises(ConfigError) as refused:
        check_overrides(["doctor.foo=1"], "doctor")
    assert "did you mean doctor?" not in str(refused.value)
    # an accelerate examples user's, a Hugging Face Trainer user's names: this project's is said
    with pytest.raises(ConfigError, match="this project's name for it: trainer.accumulate_grad_batches$"):
        check_overrides(["trainer.gradient_accumulation_steps=2"], "train")
    with pytest.raises(ConfigError, match="top-level resume_from_checkpoint; this project's name for it: ckpt_path"):
        check_overrides(["+resume_from_checkpoint=x"], "train")
    # a lightning-hydra-template user's top-level settings (test=false: "unknown setting test"; train=false: "did
    # you mean trainer?")
    with pytest.raises(ConfigError, match=r"^unknown setting test; this project's name for it: test_after_fit \("):
        check_overrides(["test=false"], "train")
    with pytest.raises(ConfigError, match=r"^unknown setting train; this project's name for it: none: the command"):
        check_overrides(["train=false"], "train")
    with pytest.raises(ConfigError, match=r"top-level tags; this project's name for it: \+logger.tags=\[a,b\]"):
        check_overrides(["+tags=[dev]"], "train")
    with pytest.raises(ConfigError, match=r"^unknown setting model.net.batch_size \(to add a new key"):
        check_overrides(["model.net.batch_size=4"], "train")  # a net of yours may take it: no other name told
    (tmp_path / "config.yaml").write_text("trainer:\n  max_epochs: 3\n  max_steps: 6\n")
    assert ending_limit(tmp_path) == "trainer.max_steps"
    (tmp_path / "config.yaml").write_text("trainer:\n  max_epochs: 3\n  max_steps: -1\n")
    assert ending_limit(tmp_path) == "trainer.max_epochs"


def test_a_folder_of_presets_of_your_own_is_added_with_a_plus(tmp_path, monkeypatch):
    """lightning-hydra-template's experiment/ presets: a folder of `# @package _global_` files, each added with
    +GROUP=NAME (the refusal named a command that does not exist); a folder named experiment/ would hide the run's
    name (experiment=NAME), and is refused saying so."""
    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    for group in ("recipe", "experiment"):  # (recipe/ may hold presets of yours already: the README suggests it)
        (configs / group).mkdir(exist_ok=True)
        (configs / group / "quick.yaml").write_text("# @package _global_\ntrainer:\n  max_epochs: 3\n")
    from {{ cookiecutter.package_name }}.config import groups, overrides, settings  # (each took the folder on import)

    for module in (groups, overrides, settings):
        monkeypatch.setattr(module, "CONFIG_DIR", configs)
    check_group_choices(["+recipe=quick"])
    check_overrides(["+recipe=quick", "trainer.max_epochs=2"], "train")
    with pytest.raises(ConfigError, match=r"configs/recipe/ is not in the training's defaults .* \+recipe=quick$"):
        check_group_choices(["recipe=quick"])
    with pytest.raises(ConfigError, match="unknown recipe 'no_such_recipe'; valid: (.*, )?quick"):
        check_group_choices(["+recipe=no_such_recipe"])
    with pytest.raises(ConfigError, match=r"makes `experiment` a config group, which hides the run's name"):
        check_group_choices(["experiment=quick"])


def test_a_config_folder_of_your_own_is_searched_and_a_runs_record_is_refused_as_a_config(tmp_path):
    """Presets kept outside the package: `--config-dir DIR` was refused for every command line ("Cannot find primary
    config 'train'"), `hydra.searchpath=[file://DIR] +recipe=quick` as a setting no part of the training reads. A
    run's config.yaml given as the config to run ended in a traceback and left a run folder."""
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "quick.yaml").write_text("# @package _global_\ntrainer:\n  max_epochs: 3\n")
    check_overrides(["--config-dir", str(tmp_path), "+recipe=quick", "trainer.max_epochs=2"], "train")
    check_overrides([f"hydra.searchpath=[file://{tmp_path}]", "+recipe=quick", "trainer.max_epochs=2"], "train")
    with pytest.raises(ConfigError, match="unknown setting trainer.max_epoch; did you mean trainer.max_epochs"):
        check_overrides([f"--config-dir={tmp_path}", "+recipe=quick", "trainer.max_epoch=2"], "train")
    (tmp_path / "config.yaml").write_text("seed: 1\ntrainer:\n  max_epochs: 3\n")  # (a run folder's record)
    with pytest.raises(
        ConfigError, match=r"--config-name config: .*config.yaml does not compose the training's config"
    ):
        check_overrides(["--config-dir", str(tmp_path), "--config-name", "config", "trainer.max_epochs=2"], "train")


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=CASE_NAMES[: len(BAD_INPUT)])
def test_bad_input_fails_in_one_line(refused, case):
    refused[case].assert_rejected(BAD_INPUT[case][1])


def _halves_through_synchronised_batchnorm(rank: int, store_file: str, offset: float, spread: float, atol: float):
    """Process `rank` of 2: its half of the batch through SynchronisedBatchNorm, checked against torch's BatchNorm
    on the whole batch (outputs, input gradients, the summed weight gradients and the running statistics)."""
    torch.set_num_threads(1)  # a fork's OpenMP pool, started by its parent's earlier tests, hangs at its first use
    dist.init_process_group("gloo", store=dist.FileStore(store_file, 2), rank=rank, world_size=2)
    torch.manual_seed(0)
    whole = (offset + spread * torch.randn(16, 3, 5)).requires_grad_()
    upstream = torch.randn(16, 3, 5)  # d(loss)/d(output), the same in both processes
    reference = torch.nn.BatchNorm1d(3)
    synchronised = SynchronisedBatchNorm.convert(torch.nn.BatchNorm1d(3))
    expected = reference(whole)
    (expected * upstream).sum().backward()
    mine = slice(rank * 8, (rank + 1) * 8)
    half = whole.detach()[mine].clone().requires_grad_()
    out = synchronised(half)
    (out * upstream[mine]).sum().backward()
    weight_grad = synchronised.weight.grad.clone()
    dist.all_reduce(weight_grad)  # what DDP does with each process's share
    close = partial(torch.testing.assert_close, atol=atol, rtol=1e-4)
    close(out.detach(), expected.detach()[mine])
    close(half.grad, whole.grad[mine])
    close(weight_grad, reference.weight.grad)
    close(synchronised.running_mean, reference.running_mean)
    close(synchronised.running_var, reference.running_var)
    dist.destroy_process_group()


@pytest.mark.parametrize(("offset", "spread", "atol"), [(0.0, 1.0, 1e-5), (100.0, 0.1, 1e-3)])
def test_synchronised_batchnorm_normalises_two_halves_as_one_device_the_whole_batch(tmp_path, offset, spread, atol):
    """Two real gloo processes (forked from this one). Offset 100, spread 0.1 (readings with an offset; float32 then
    holds x - mean to about 1e-4 of the spread, hence atol): the one-pass variance, E[x^2] - E[x]^2, was off by 30%
    there, and of any sign further out (NaN losses)."""
    torch.multiprocessing.start_processes(
        _halves_through_synchronised_batchnorm,
        (str(tmp_path / "store"), offset, spread, atol),
        nprocs=2,
        start_method="fork",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "accelerator",
    ["cpu", pytest.param("gpu", marks=pytest.mark.gpu(2))],
)
def test_batchnorm_under_ddp_is_synchronised_and_trains_like_one_device(train, accelerator):
    """BatchNorm over the global batch in 2 processes (gloo on CPU: batchnorm.SynchronisedBatchNorm; GPUs: torch's
    SyncBatchNorm): the losses of one device. Each process normalising its half by its own statistics (plain
    BatchNorm, trainer.sync_batchnorm=false) parts from them at the first step."""
    parity = [*QUICK, f"trainer.max_steps={K}", "data.shuffle=false", "data.batch_size=64", "model.net.norm=batch"]
    parity.append(f"trainer.accelerator={accelerator}")
    single = train(*parity, "strategy=single", "trainer.devices=1")
    ddp = train(*parity, *DDP, launcher=launcher_of("ddp", 2))  # (ddp_spawn: the same processes, started slower)
    assert "BatchNorm layers synchronised across 2 processes" in ddp.output
    tolerance = TOLERANCE if accelerator == "cpu" else 1e-4  # GPU reductions in another order
    assert ddp.losses(K) == pytest.approx(single.losses(K), abs=tolerance)
    if accelerator == "cpu":  # one sample per process (ddp's one image per GPU): refused, as if each normalised alone
        pair = [*QUICK, "trainer.max_steps=2", "data.shuffle=false", "data.batch_size=2", "model.net.norm=batch"]
        one = train(*pair, "trainer.accelerator=cpu", "strategy=single", "trainer.devices=1")
        each = train(*pair, "trainer.accelerator=cpu", *DDP, launcher=launcher_of("ddp", 2))
        assert each.losses(2) == pytest.approx(one.losses(2), abs=1e-4)  # (the variance of 2 values: sensitive)


def test_epochs_limited_to_some_batches_train_those_and_validate_after_them(train, single_losses):
    """trainer.limit_train_batches=2 (Lightning's setting, in both engines): epochs of 2 optimizer steps, each one
    validated; the first epoch trains the unlimited run's first batches (its losses). The best checkpoint is the one
    of the highest val/acc under checkpoint.monitor=val/acc (the first of equals)."""
    limited = ["trainer.max_steps=-1", "trainer.max_epochs=3", "trainer.limit_train_batches=2"]
    tests = ["test_after_fit=true", "trainer.limit_test_batches=2"]
    run = train(*PARITY, *limited, "checkpoint.monitor=val/acc", "checkpoint.keep_last=3", *tests)
    assert run.wandb.steps("train/loss") == list(range(6))
    assert run.losses(2) == pytest.approx(single_losses[:2], abs=TOLERANCE)
    assert run.wandb.steps("val/loss") == [1, 3, 5], "3 epochs, each validated"
    accuracies = run.wandb.metric("val/acc")
    best = best_step(run.run_dir)
    assert best == 2 * (1 + accuracies.index(max(accuracies))), accuracies
    # Testing a checkpoint again (docs/outputs.md): started from it in a new folder, with its own step as the end,
    # the training has nothing left to train and tests its weights. (Lightning tested the best checkpoint of the
    # run the given one came from: another checkpoint, or, deleted by keep_last since, a traceback.)
    # The second, as typed from the folder the command runs in, under hydra.job.chdir=true (the run starts in its own
    # folder: the path is the command line's, not the run folder's).
    tested = {}
    other = next(step for step in (2, 4, 6) if step != best)
    for step, chdir in ((best, []), (other, ["hydra.job.chdir=true"])):
        checkpoint = step_checkpoint(run.run_dir, step)
        checkpoint = checkpoint.relative_to(run.run_dir.parent) if chdir else checkpoint
        again = [f"ckpt_path={checkpoint}", f"trainer.max_steps={step}", *chdir]
        tested[step] = train(*PARITY, *limited[1:], *tests, *again).wandb.metric("test/loss")  # (max_steps: its)
    assert len(tested[best]) == 1 and tested[best] == pytest.approx(run.wandb.metric("test/loss")), "as the run did"
    assert len(set(map(tuple, tested.values()))) == 2, "each checkpoint's own weights"


@pytest.mark.slow
def test_a_model_with_a_parameter_no_step_uses_is_refused_under_ddp_until_told(train, single_losses):
    """DDP (both engines) fails at the second step of a model whose forward leaves a parameter out. That failure is
    one line naming strategy.find_unused_parameters=true, with which the model trains as one device does."""
    net = "model.net._target_=own_models.WithUnusedHead"
    launcher = launcher_of("ddp", 2)
    refused = train(*PARITY, *DDP, net, launcher=launcher, check=False)
    errors = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "set strategy.find_unused_parameters=true" in errors[0], refused.output[-3000:]
    assert "got no gradient in a training step (auxiliary.weight, auxiliary.bias)" in errors[0]
    if launcher is None:  # (a launcher, accelerate launch, reports a failed process with its own traceback)
        assert refused.returncode == 2 and "Traceback" not in refused.output, refused.output[-3000:]
    else:
        assert refused.returncode != 0
    told = train(*PARITY, *DDP, net, "strategy.find_unused_parameters=true", launcher=launcher_of("ddp", 2))
    assert told.losses(K) == pytest.approx(single_losses, abs=TOLERANCE)
