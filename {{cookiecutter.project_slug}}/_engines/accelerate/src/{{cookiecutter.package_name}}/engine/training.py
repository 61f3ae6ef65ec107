"""The Accelerate engine's training: strategy (checked before anything starts) -> processes -> accelerator -> data
-> model -> fit (loop.py) -> test (evaluation.py). What a preset changes lives in strategies/.

The command, `python -m {{ cookiecutter.package_name }}.train` (or `accelerate launch ... -m
{{ cookiecutter.package_name }}.train` for the presets that say so), calls train() and reports a refusal in one line.
"""

import functools
import logging
import multiprocessing
import os
import sys
from pathlib import Path

import accelerate.optimizer
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch import nn

from ..config import CONFIG_DIR
from ..config.objects import build_object as build
from ..config.settings import LIGHTNING_TRAINER_ONLY, interpolations, is_read, leaves
from ..data.batch_sizes import batches_per_epoch, check_epoch_batches, check_limit, per_device_batch_size
from ..data.checks import (
    check_evaluation_batches,
    check_input,
    check_output,
    first_input,
    first_sample,
    targets_are_values,
)
from ..data.sampling import check_position
from ..errors import ConfigError, Interrupted, said_once, unused_parameters
from ..models.activation_checkpointing import check_activation_checkpointing, checkpoint_blocks
from ..models.compilation import compile_net
from ..models.float8 import check_float8, check_float8_layers, convert_float8
from ..parallel.batchnorm import (
    accumulation_note,
    micro_batch_split_problem,
    oom_handling_problem,
    unsynchronised_note,
    uses_batchnorm,
)
from ..parallel.launcher import (
    check_srun_tasks_joined,
    detect_launcher,
    die_with_launcher,
    fit_layout_to_launcher,
    is_first_process,
    one_process_note,
    warn_if_restarts_can_hang,
)
from ..parallel.plan_values import check_plan_values
from ..parallel.presets import built_in_preset
from ..parallel.sharding import check_layer_devices, check_sized_parameters
from ..parallel.split import check_chain
from ..runtime.async_saves import check_async
from ..runtime.checkpoint_files import last_of_run_folder
from ..runtime.hardware import oversubscribed_note
from ..runtime.interrupt import ctrl_c, interrupted, mark_finished, stops_at_once
from ..runtime.memory import FINDER_REFUSED, check_oom_settings, configure_allocator
from ..runtime.metrics import check_monitor
from ..runtime.optimization import check_optimization, grouped_optimizer, respan
from ..runtime.precision import resolve_precision, use_tensor_cores
from ..runtime.resuming import (
    afresh_message,
    check_not_past_the_end,
    check_same_shapes,
    check_saved_run,
    resuming_message,
    starting_from_message,
    starting_point,
)
from ..runtime.run_folder import HELD_BY_THE_COMMAND, record_start
from ..tracking.wandb_run import finish_wandb, forget_wandb_run, wandb_mode, write_atomically
from .checkpoints import LAST, PROGRESS, Checkpoints, trained_so_far
from .evaluation import batches, evaluate, log, prefixed, show
from .logger import ResumingWandBTracker
from .loop import Progress, accumulation, fit, loss_fn, step_bar, training_steps
from .oom.batch_size_finder import find_batch_size
from .oom.recovery import OOMRecovery
from .strategies import Strategy, check_devices
from .torchrun import LAUNCHED_PRESETS, start_processes

logging.getLogger("accelerate").setLevel(logging.WARNING)  # not one INFO line per file it saves
# AcceleratedOptimizer.step asks twice per step whether the lomo_optim package is installed: an uncached
# package-metadata scan of ~45 us each, a tenth of a small step. The answer cannot change during a run.
accelerate.optimizer.is_lomo_available = functools.cache(accelerate.optimizer.is_lomo_available)

# trainer.precision takes Lightning's names, so both engines share the flag; accelerate's names on the right.
PRECISION = {"32-true": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def train(cfg: DictConfig) -> None:
    """Check the layout, start the processes, fit and test. Raises ConfigError before training."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # ddp_spawn forks its processes, which cannot use CUDA if this one initialised it: asking whether CUDA exists
    # must ask NVML, not the CUDA runtime (torch.cuda.is_available() initialises CUDA's driver otherwise).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    configure_allocator()  # before anything initialises CUDA
    # A restart continues from the run's last checkpoint; checkpoints of another training are refused.
    cfg.ckpt_path, cfg.resume = starting_point(run_dir, cfg, run_dir / "checkpoints" / LAST)
    launched = int(os.environ.get("WORLD_SIZE", 1))
    strategy, processes, recovery = check_config(cfg, launched)  # (its refusals of a layout first, then:)
    if launched > 1 and detect_launcher() is None and multiprocessing.parent_process() is None:
        # (left from another job in this shell: the Accelerator waited for processes that never come, for ever with
        # MASTER_ADDR and MASTER_PORT set too, or said MASTER_ADDR was missing, in a traceback)
        raise ConfigError(
            f"WORLD_SIZE={launched} is set, but no launcher (torchrun, accelerate launch, srun) started this process: "
            "left from another job? unset WORLD_SIZE (for N processes here: trainer.devices=N)"
        )
    starts_them = strategy.name in LAUNCHED_PRESETS and processes > launched  # trainer.devices=N without a launcher
    last = run_dir / "checkpoints" / LAST
    given = bool(cfg.ckpt_path)
    start = Path(cfg.ckpt_path) if given else last if cfg.resume and last.exists() else None
    strategy.check_resume(start, processes, given)
    if start:
        limits = cfg.trainer.max_epochs, cfg.trainer.max_steps
        note = check_not_past_the_end(start, *trained_so_far(start), *limits, given, cfg.test_after_fit)
        if note and is_first_process() and not starts_them:  # (the processes it starts say it)
            print(note)
    if cfg.check_only:
        counted = f"{processes} process{'es' if processes > 1 else ''}"
        chosen = HydraConfig.get().runtime.choices["strategy"]  # (a preset of yours by its name)
        if is_first_process():  # (every launched process checks)
            print(f"check_only: the command passes its checks (strategy={chosen}, {counted}); nothing was trained")
        return
    if starts_them:
        start_processes(processes, run_dir, cfg.run_id)  # under torchrun (engine/torchrun.py)
        return

    def process() -> None:  # a named function: notebook_launcher (ddp_spawn) needs one
        fit_and_test(cfg, strategy, run_dir, recovery)

    try:
        strategy.launch(process, processes)
    finally:
        # accelerate keeps its state per process (AcceleratorState, a singleton; no public reset): a next training in
        # this process (a --multirun's next job, a notebook's next cell) with another precision, or ddp_spawn's
        # notebook_launcher, refused to start ("already been initialized")
        AcceleratorState._reset_state(reset_partial_state=True)


# The model's settings this loop reads: it builds model.net and model.optimizer; the loss is loop.py's loss_fn.
MODEL_SETTINGS = ("net", "optimizer", "no_decay_norms_and_biases")


def check_settings_read(cfg: DictConfig) -> None:
    """Refuse a trainer or model setting this loop does not read (Hydra takes `+trainer.KEY=...`, and the loop
    ignored it: Lightning's value clipping was silently norm clipping; `+model._target_=...`, the Lightning engine's
    way to another loss, trained with this one). (The oom settings: check_oom_settings, as in Lightning.)"""
    read = {
        "trainer": list(OmegaConf.load(CONFIG_DIR / "trainer" / "default.yaml")),
        "model": list(MODEL_SETTINGS),
    }
    elsewhere = {"trainer": " (Lightning's Trainer has more)", "model._target_": " (a loss of yours: engine/loop.py)"}
    read_elsewhere = interpolations([value for _, value in leaves(cfg)])  # `+model.width=8 ...=${model.width}`
    for node, settings in read.items():
        if unread := [key for key in sorted(set(cfg[node]) - set(settings)) if not is_read(key, read_elsewhere)]:
            if node == "trainer" and unread[0] in LIGHTNING_TRAINER_ONLY:  # (as without the +: the same words)
                raise ConfigError(
                    f"trainer.{unread[0]} is a setting of Lightning's Trainer, not of this loop; it reads: "
                    + ", ".join(sorted(settings))
                )
            hint = elsewhere.get(node, elsewhere.get(f"{node}.{unread[0]}", ""))
            raise ConfigError(
                f"{node}.{unread[0]} is not a setting of this loop{hint}; it reads: {', '.join(settings)}"
            )


def check_config(cfg: DictConfig, launched: int) -> tuple[Strategy, int, OOMRecovery | None]:
    """Everything that can refuse this config, before a process starts or a file is written, for a training
    that a launcher started in `launched` processes (1 without a launcher): raises ConfigError. Returns the
    strategy, the processes the training will have, and the OOM recovery. The search runs it on the config of
    its first trial, so that a config every trial would refuse is refused before the first one."""
    if cfg.ckpt_path:  # a run folder: its last checkpoint (train.py took it already; the search's trials not yet)
        cfg.ckpt_path = str(last_of_run_folder(Path(cfg.ckpt_path), LAST))
    if cfg.ckpt_path and not (Path(cfg.ckpt_path) / PROGRESS).is_file():
        check_saved_run(Path(cfg.ckpt_path), LAST)
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} is not a checkpoint folder; give one, e.g. <run dir>/checkpoints/last, or a "
            "run folder"
        )
    check_settings_read(cfg)
    if (deterministic := cfg.trainer.get("deterministic", False)) not in (True, False, "warn"):  # (Lightning's values)
        raise ConfigError(f"trainer.deterministic={deterministic}: give true, false or warn")
    if cfg.trainer.max_steps is None:  # "no limit" as the docs say (-1 or null): the loop counts with -1
        cfg.trainer.max_steps = -1
    if cfg.logger:
        wandb_mode()  # a WANDB_MODE wandb would refuse, now
    cfg.trainer.precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)  # auto: bf16 on GPUs
    launched_with = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")  # accelerate launch --mixed_precision
    if launched_with != "no" and PRECISION.get(cfg.trainer.precision) != launched_with:  # (the Accelerator's wins)
        named = {value: key for key, value in PRECISION.items()}.get(launched_with)
        raise ConfigError(
            f"accelerate launch --mixed_precision {launched_with} (or its config) is not trainer.precision="
            f"{cfg.trainer.precision}, which this project reads, in both engines: give trainer.precision="
            f"{named or '|'.join(PRECISION)} and leave the launcher's at no"
        )
    preset = built_in_preset(HydraConfig.get().runtime.choices["strategy"], cfg.strategy)  # (a file of yours: its kind)
    strategy: Strategy = build(cfg.strategy)
    check_oom_settings(cfg.oom)
    if cfg.oom.find_batch_size and not strategy.supports_batch_size_search:
        raise ConfigError(
            f"oom.find_batch_size works under strategy=single|ddp|ddp_spawn|dp, not strategy={strategy.name} "
            f"({FINDER_REFUSED[strategy.name]}); turn it off with oom.find_batch_size=false"
        )
    recovery = OOMRecovery(strategy, **cfg.oom.recovery) if cfg.oom.recovery else None
    if recovery and cfg.trainer.accumulate_grad_batches != 1:
        raise ConfigError(
            "oom.recovery runs the backward itself: use trainer.accumulate_grad_batches=1, or turn it off with "
            "oom.recovery=null"
        )
    # Under torchrun or SLURM: the launcher's layout, unless the command line gives one (checked against it).
    overrides = HydraConfig.get().overrides.task
    check_devices(cfg.trainer.accelerator, cfg.trainer.devices, preset, cfg.trainer.num_nodes)
    _, devices = fit_layout_to_launcher(preset, cfg.trainer.num_nodes, cfg.trainer.devices, overrides)
    warn_if_restarts_can_hang()
    die_with_launcher()  # an orphan of a dead torchrun agent trained on
    if devices in ("auto", -1):  # every visible GPU, as in Lightning (1 on CPU)
        devices = max(torch.cuda.device_count(), 1)
    if launched == 1 and preset in LAUNCHED_PRESETS and int(devices) > 1 and detect_launcher() is None:
        launched = int(devices)  # trainer.devices=N without a launcher: train() starts them (engine/torchrun.py)
    processes = strategy.processes(launched, devices)
    check_srun_tasks_joined("TORCHELASTIC_RUN_ID" in os.environ)  # (srun's tasks join under torchrun only)
    cfg.trainer.devices = int(devices)  # the count this machine runs (a launcher's, or auto's), as the config logs it
    check_async(cfg.checkpoint.get("async", False), preset, strategy.writes_checkpoint_parts)
    with torch.device("meta"):  # shapes and hooks only: the real net is built in each process
        net = build(cfg.model.net)
        check_sized_parameters(net, preset)  # (before the preset's own checks, which read the sizes)
        strategy.check_layout(processes, net, cfg)
    if cfg.ckpt_path:  # another net's tensors? (a checkpoint away from its run folder: no config.yaml says)
        check_same_shapes(Path(cfg.ckpt_path), net)
    if strategy.sync_batchnorm and recovery:
        off = ", or turn it off with oom.recovery=null"
        raise ConfigError(oom_handling_problem("oom.recovery", splits_batches=True) + off)
    if recovery and recovery.policy == "split" and uses_batchnorm(net):
        raise ConfigError(micro_batch_split_problem("oom.recovery.policy"))
    if strategy.sync_batchnorm and cfg.oom.find_batch_size:
        off = ", or turn it off with oom.find_batch_size=false"
        raise ConfigError(oom_handling_problem("oom.find_batch_size", splits_batches=False) + off)
    replicas = strategy.data_parallel(0, processes)[0]
    micro = per_device_batch_size(cfg.data.batch_size, replicas, accumulation(cfg))
    data = build(cfg.data)
    data.check_replicas(replicas, processes)
    if (note := accumulation_note(net, cfg.trainer.accumulate_grad_batches)) and says_notes():
        print(note, file=sys.stderr)
    unsynchronised = strategy.name in ("ddp", "ddp_spawn") and not cfg.trainer.sync_batchnorm
    if unsynchronised and (note := unsynchronised_note(net, replicas)) and says_notes():
        print(note, file=sys.stderr)
    check_input(net, data, cfg.trainer.precision.endswith("-mixed"))  # e.g. model=gpt and data not token ids
    check_monitor(cfg.checkpoint.monitor, targets_are_values(data))
    check_activation_checkpointing(net, cfg.activation_checkpointing)  # (before the net's other checks, as Lightning)
    # what the loss can take, for the data's targets (`net` on meta: shapes)
    check_output(net, data, loss_fn, micro, synchronised=strategy.sync_batchnorm)
    check_optimization(cfg, build(cfg.model.optimizer), build(cfg.scheduler))
    for limit in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        check_limit(limit, cfg.trainer[limit])
    tested = cfg.trainer.limit_test_batches if cfg.test_after_fit else None
    check_evaluation_batches(data, replicas, {"val": cfg.trainer.limit_val_batches, "test": tested})
    if (limit := cfg.trainer.limit_train_batches) is not None:
        whole = len(data.loader("train", replicas, accumulate=accumulation(cfg)))  # (whole optimizer steps)
        check_epoch_batches(limit, batches_per_epoch(whole, limit), accumulation(cfg))
    tensor_parallel = strategy.mesh(processes)[1]
    check_float8(cfg.float8, strategy.name, cfg.trainer.accelerator, tensor_parallel)
    check_float8_layers(net, cfg.float8)
    if strategy.name == "pipeline":  # the stages run the Split's chain, not the model's forward: the same model?
        check_chain(build(cfg.model.net), first_sample(data))  # compares values: a real net (`net` is on meta)
    if strategy.name == "model_parallel" and cfg.strategy.mode == "layers":  # a skip connection across the devices?
        check_layer_devices(build(cfg.model.net), first_input(data), len(strategy.layer_devices))
    if tensor_parallel > 1:  # (model_parallel, pipeline) a plan that changes what the net computes?
        check_plan_values(lambda: build(cfg.model.net), first_sample(data), tensor_parallel)
    layers = strategy.name == "model_parallel" and cfg.strategy.mode == "layers"  # one process, always
    if strategy.name in ("ddp", "ddp_spawn", "fsdp", "model_parallel") and not layers and processes == 1:
        # Not refused, as in the Lightning engine: devices=auto on a one-GPU machine is a fair choice. Said, because
        # on the CPU devices=auto means one process, which a user asking for ddp (fsdp, ...) rarely means.
        if says_notes():
            print(one_process_note(strategy.name), file=sys.stderr)
    on_cpu = cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available()
    if on_cpu and says_notes() and (note := oversubscribed_note(int(devices))):
        print(note, file=sys.stderr)
    return strategy, processes, recovery


def says_notes() -> bool:
    """Whether this process says check_config's notes: the first one, unless this command started it under torchrun
    (engine/torchrun.py), having said them itself before."""
    return is_first_process() and HELD_BY_THE_COMMAND not in os.environ


def float8_net(net: nn.Module, recipe: str, accelerator: Accelerator) -> nn.Module:
    """The net with its blocks' big Linear layers in float8 (models/float8.py), before the preset shards or wraps it."""
    converted = convert_float8(net, recipe)
    if converted:
        accelerator.print(f"float8={recipe}: {len(converted)} Linear layers of the blocks compute in float8")
    return net


def fit_and_test(cfg: DictConfig, strategy: Strategy, run_dir: Path, recovery: OOMRecovery | None) -> None:
    """What every training process runs."""
    use_tensor_cores(cfg.tf32)  # here, in every process: a forked or spawned process does not inherit it
    accelerator = Accelerator(
        cpu=cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available(),  # else 2 CPU processes do not connect
        mixed_precision=PRECISION[cfg.trainer.precision],
        gradient_accumulation_steps=cfg.trainer.accumulate_grad_batches,
        log_with=ResumingWandBTracker(run_dir, **cfg.logger) if cfg.logger else None,
        project_dir=run_dir,
        **strategy.accelerator_kwargs(),
    )
    set_seed(cfg.seed)
    deterministic_kernels(cfg.trainer.get("deterministic", False))
    data = build(cfg.data)
    net = strategy.build_net(lambda: float8_net(build(cfg.model.net), cfg.float8, accelerator))
    optimizer_factory = functools.partial(
        grouped_optimizer, build(cfg.model.optimizer), no_decay_norms_and_biases=cfg.model.no_decay_norms_and_biases
    )
    model, optimizer = strategy.prepare(accelerator, net, optimizer_factory)
    checkpoint_blocks(net, cfg.activation_checkpointing)  # in place, after sharding, before compiling
    if cfg.compile:  # the net in place, inside ddp's wrapper, after sharding; compiled at its first call
        compile_net(net, per_block=strategy.compiles_per_block)
    replicas, rank = strategy.data_parallel(accelerator.process_index, accelerator.num_processes)
    steps = training_steps(cfg, data, replicas, rank)  # the schedule's span, and the progress bar's
    scheduler = build(cfg.scheduler)(optimizer, total_steps=steps)
    progress = Progress()
    # The strategy's objects come right after the progress: load_trained reads the first of them.
    accelerator.register_for_checkpointing(progress, *strategy.checkpoint_objects(model, optimizer), scheduler)
    sharded = strategy.sharded_state(model, optimizer)
    if sharded is not None:
        sharded.writer.background = cfg.checkpoint.get("async", False)
    checkpoints = Checkpoints(accelerator, run_dir / "checkpoints", sharded, cfg.checkpoint.keep_last, net)
    start = resume_point(accelerator, cfg, checkpoints)
    if start:
        checkpoints.load(start)
        # accelerate counts micro-batches to know which ends an optimizer step; its count is saved, and a checkpoint
        # of another trainer.accumulate_grad_batches (ckpt_path=) left it mid-step: counted again from the step.
        accelerator.step = progress.global_step * accumulation(cfg)
        if cfg.ckpt_path:  # another run's: this run's best starts afresh, as Lightning's in another folder does
            progress.best = None
        if not (cfg.oom.find_batch_size and progress.found_batch_size):  # (a batch found is continued with)
            # before wandb starts: mid-epoch, a whole step ahead? a stream's on another layout?
            check_position(progress.loader, data.batch_size, replicas, cfg.data.num_workers)
        if cfg.ckpt_path:  # (after its refusals: one line alone)
            accelerator.print(starting_from_message(start))
    if recovery:  # the micro-batch size that fitted before a restart, agreed by all processes
        recovery.load_state_dict(progress.oom_recovery, accelerator)

    failed = True
    try:
        if accelerator.is_main_process:
            write_atomically(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))  # others may read it
            mark_finished(run_dir, False)
            record_start(run_dir, start)  # (starts.jsonl: each start's settings, versions and git commit)
            start_wandb(accelerator, cfg, strategy, replicas, data.batch_size)
        if cfg.oom.find_batch_size and progress.found_batch_size:  # searched before this run was restarted
            data.batch_size = progress.found_batch_size
            accelerator.print(f"find_batch_size: global batch {data.batch_size}, found before the restart")
            steps = training_steps(cfg, data, replicas, rank)  # the progress bar's (the schedule is the checkpoint's)
        elif cfg.oom.find_batch_size:
            finder = {**cfg.oom.batch_size_finder, "accumulation": accumulation(cfg)}
            with stops_at_once("the batch-size search"):
                find_batch_size(accelerator, strategy, model, optimizer, data, replicas, loss_fn, **finder)  # lr scaled
            progress.found_batch_size = data.batch_size
            steps = training_steps(cfg, data, replicas, rank)  # of the batch found
            respan(scheduler, build(cfg.scheduler), steps)
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes))
        on_gpu, accumulate = accelerator.device.type == "cuda", accumulation(cfg)
        limit = cfg.trainer.limit_train_batches  # (Lightning's loop applies it; this one, the loader)
        loaders = {
            split: data.loader(split, replicas, rank, on_gpu, per_node, accumulate, limit if split == "train" else None)
            for split in data.split_names
        }
        # Ctrl-C: stop after this step (several processes: at a logged step), with a checkpoint
        with (
            ctrl_c(accelerator.num_processes, announce=accelerator.is_main_process) as interrupt,
            step_bar(accelerator, cfg, steps, progress.global_step) as bar,
        ):
            state = (model, optimizer, scheduler, loaders, progress, checkpoints)
            try:
                stopped = fit(accelerator, cfg, strategy, *state, recovery, interrupt, bar)
            except RuntimeError as err:  # DDP's, for a parameter a step did not use: what to set, in one line
                trained = [name for name, p in accelerator.unwrap_model(model).named_parameters() if p.requires_grad]
                if refusal := unused_parameters(str(err), strategy.name, trained):
                    raise said_once(refusal, accelerator.is_main_process) from err
                raise
        checkpoints.finish()  # a checkpoint still being written (checkpoint.async=true): in place, `last` on it
        if stopped is not None:  # Ctrl-C: saved, stopped; say how to continue
            failed = False
            said = interrupted(stopped, checkpoints.last, cfg.run_id)
            raise said if accelerator.is_main_process else Interrupted("")
        test_batches = batches(cfg.trainer.limit_test_batches, len(loaders["test"])) if "test" in loaders else 0
        if cfg.test_after_fit and test_batches:  # data=files: the test split is optional
            step, best = progress.global_step, checkpoints.folder / "best"
            # Lightning's epoch at the test: the epochs begun (one stopped by max_steps counts), not the best one's
            epoch = progress.epoch + bool(progress.loader)
            accelerator.wait_for_everyone()  # the main process writes the checkpoints; the others read them
            if best.is_dir():  # else no validation ran: test the weights as they are
                checkpoints.load(best)
            metrics = evaluate(accelerator, model, loaders["test"], loss_fn, cfg.trainer.limit_test_batches)
            log(accelerator, {**prefixed("test", metrics), "epoch": epoch}, step)  # as Lightning's row
            if accelerator.is_main_process:
                show(prefixed("test", metrics))
        failed = False
        if accelerator.is_main_process:
            mark_finished(run_dir, True)  # run_id=last continues unfinished runs only
    finally:
        finish_wandb(failed)


def resume_point(accelerator: Accelerator, cfg: DictConfig, checkpoints: Checkpoints) -> Path | None:
    """Where training starts: `ckpt_path` if given; else the run's last complete checkpoint, so that a
    restarted run (torchrun, a SLURM requeue, the same command again) continues by itself; resume=false
    starts afresh and removes the run's checkpoints."""
    if cfg.ckpt_path:
        return Path(cfg.ckpt_path)
    if not cfg.resume:
        if checkpoints.last:
            accelerator.print(afresh_message(checkpoints.folder.parent))
        if accelerator.is_main_process:
            forget_wandb_run(checkpoints.folder.parent)  # and a new wandb run
        checkpoints.clear()
        return None
    if checkpoints.last:
        accelerator.print(resuming_message(checkpoints.last))
    return checkpoints.last


def deterministic_kernels(setting: bool | str) -> None:
    """trainer.deterministic as Lightning's Trainer takes it (checked by check_config): true, torch's deterministic
    kernels only (an error where an operation has none), "warn" a warning there; and cuBLAS's fixed workspace, which
    they need on GPUs."""
    if setting:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(bool(setting), warn_only=setting == "warn")


def start_wandb(accelerator: Accelerator, cfg: DictConfig, strategy: Strategy, replicas: int, batch: int) -> None:
    """One wandb run (main process), with the resolved config and how the run is laid out."""
    if not cfg.logger:
        return
    config = OmegaConf.to_container(cfg, resolve=True)
    processes = accelerator.num_processes
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", processes))
    config["run"] = {
        "engine": "accelerate",
        "strategy_preset": HydraConfig.get().runtime.choices["strategy"],  # as given: a preset of yours by its name
        "world_size": processes,
        "devices": per_node,
        "num_nodes": processes // per_node,
        "data_parallel_size": replicas,
        "per_device_batch_size": per_device_batch_size(batch, replicas, accumulation(cfg)),
        "layout": strategy.device_layout(processes).as_config(),
    }
    accelerator.init_trackers(cfg.logger.project, config=config)
    accelerator.get_tracker("wandb", unwrap=True).define_metric("*", step_metric="trainer/global_step")
