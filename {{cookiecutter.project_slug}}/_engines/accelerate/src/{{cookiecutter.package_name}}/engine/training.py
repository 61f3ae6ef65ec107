"""The Accelerate engine's training: strategy (checked before anything starts) -> processes -> accelerator -> data
-> model -> fit -> test. The loop below is the whole training: what a preset changes lives in strategies/.

The command, `python -m {{ cookiecutter.package_name }}.train` (or `accelerate launch ... -m
{{ cookiecutter.package_name }}.train` for the presets that say so), calls train() and reports a refusal in one line.
"""

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import accelerate.optimizer
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from ..config import build_object as build
from ..data.loading import IGNORED, Data, check_input, first_sample, per_device_batch_size
from ..errors import ConfigError
from ..models.compilation import compile_net
from ..parallel.batchnorm import micro_batch_split_problem, oom_handling_problem, uses_batchnorm
from ..parallel.launcher import fit_layout_to_launcher, warn_if_restarts_can_hang
from ..parallel.sharding import clip_grad_norm_
from ..parallel.split import check_chain
from ..runtime.memory import configure_allocator
from ..runtime.metrics import perplexity
from ..runtime.optimization import current_lr, grouped_optimizer, respan, total_steps
from ..runtime.precision import resolve_precision, use_tensor_cores
from ..runtime.resuming import starting_point
from ..tracking.epoch_metrics import append_epoch_metrics
from ..tracking.wandb_run import finish_wandb, forget_wandb_run, write_atomically
from .checkpoints import Checkpoints
from .logger import ResumingWandBTracker
from .oom import OOMRecovery, OutOfMemoryStop, find_batch_size, log_device_memory
from .strategies import Strategy

logging.getLogger("accelerate").setLevel(logging.WARNING)  # not one INFO line per file it saves
# AcceleratedOptimizer.step asks twice per step whether the lomo_optim package is installed: an uncached
# package-metadata scan of ~45 us each, a tenth of a small step. The answer cannot change during a run.
accelerate.optimizer.is_lomo_available = functools.cache(accelerate.optimizer.is_lomo_available)

# trainer.precision takes Lightning's names, so both engines share the flag; accelerate's names on the right.
PRECISION = {"32-true": "no", "bf16-mixed": "bf16", "16-mixed": "fp16"}


@dataclass
class Progress:
    """Where training is; saved with every checkpoint, so that a resumed run continues where it stopped."""

    epoch: int = 0
    loader: dict[str, Any] = field(default_factory=dict)  # the training loader's position mid-epoch ({}: at a start)
    global_step: int = 0  # optimizer steps done
    best_val_loss: float = float("inf")
    found_batch_size: int = 0  # the global batch that oom.find_batch_size found (0: not searched yet)
    oom_recovery: dict[str, int] = field(default_factory=dict)  # oom.recovery's state: its micro-batch size

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


def train(cfg: DictConfig) -> None:
    """Check the layout, start the processes, fit and test. Raises ConfigError before training."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # ddp_spawn forks its processes, which cannot use CUDA if this one initialised it: asking whether CUDA exists
    # must ask NVML, not the CUDA runtime (torch.cuda.is_available() initialises CUDA's driver otherwise).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    configure_allocator()  # before anything initialises CUDA
    # A restart continues from the run's last checkpoint; checkpoints of another training are refused.
    cfg.ckpt_path, cfg.resume = starting_point(run_dir, cfg, run_dir / "checkpoints" / "last")
    strategy, processes, recovery = check_config(cfg, launched=int(os.environ.get("WORLD_SIZE", 1)))
    last = run_dir / "checkpoints" / "last"
    strategy.check_resume(Path(cfg.ckpt_path) if cfg.ckpt_path else last if cfg.resume and last.exists() else None)
    if cfg.check_only:
        print(f"check_only: the command passes its checks ({processes} processes); nothing was trained")
        return

    def process() -> None:  # a named function: notebook_launcher (ddp_spawn) needs one
        fit_and_test(cfg, strategy, run_dir, recovery)

    strategy.launch(process, processes)


def check_config(cfg: DictConfig, launched: int) -> tuple[Strategy, int, OOMRecovery | None]:
    """Everything that can refuse this config, before a process starts or a file is written, for a training
    that a launcher started in `launched` processes (1 without a launcher): raises ConfigError. Returns the
    strategy, the processes the training will have, and the OOM recovery. The search runs it on the config of
    its first trial, so that a config every trial would refuse is refused before the first one."""
    if cfg.ckpt_path and not (Path(cfg.ckpt_path) / "custom_checkpoint_0.pkl").is_file():
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} is not a checkpoint folder; give one, e.g. <run dir>/checkpoints/last"
        )
    cfg.trainer.precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)  # auto: bf16 on GPUs
    strategy: Strategy = build(cfg.strategy)
    if cfg.oom.find_batch_size and not strategy.supports_batch_size_search:
        raise ConfigError(f"oom.find_batch_size works with single, ddp, ddp_spawn and dp, not strategy={strategy.name}")
    recovery = OOMRecovery(strategy, **cfg.oom.recovery) if cfg.oom.recovery else None
    if recovery and cfg.trainer.accumulate_grad_batches != 1:
        raise ConfigError("oom.recovery runs the backward itself: use trainer.accumulate_grad_batches=1")
    # Under torchrun or SLURM: the launcher's layout, unless the command line gives one (checked against it).
    preset, overrides = HydraConfig.get().runtime.choices["strategy"], HydraConfig.get().overrides.task
    _, devices = fit_layout_to_launcher(preset, cfg.trainer.num_nodes, cfg.trainer.devices, overrides)
    warn_if_restarts_can_hang()
    if devices in ("auto", -1):  # every visible GPU, as in Lightning (1 on CPU)
        devices = max(torch.cuda.device_count(), 1)
    processes = strategy.processes(launched, devices)
    with torch.device("meta"):  # shapes and hooks only: the real net is built in each process
        net = build(cfg.model.net)
        strategy.check_layout(processes, net, cfg)
    if strategy.sync_batchnorm and recovery:
        off = ", or turn it off with oom.recovery=null"
        raise ConfigError(oom_handling_problem("oom.recovery", splits_batches=True) + off)
    if recovery and recovery.policy == "split" and uses_batchnorm(net):
        raise ConfigError(micro_batch_split_problem("oom.recovery.policy"))
    if strategy.sync_batchnorm and cfg.oom.find_batch_size:
        off = ", or leave it off (false)"
        raise ConfigError(oom_handling_problem("oom.find_batch_size", splits_batches=False) + off)
    replicas = strategy.data_parallel(0, processes)[0]
    per_device_batch_size(cfg.data.batch_size, replicas, accumulation(cfg))
    data = build(cfg.data)
    data.check_replicas(replicas, processes)
    check_input(net, data)  # e.g. model=gpt with data that is not token ids, or uint8 images
    if strategy.name == "pipeline":  # the stages run the Split's chain, not the model's forward: the same model?
        check_chain(net, first_sample(data))
    return strategy, processes, recovery


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
    data = build(cfg.data)
    net = strategy.build_net(lambda: build(cfg.model.net))
    optimizer_factory = functools.partial(
        grouped_optimizer, build(cfg.model.optimizer), no_decay_norms_and_biases=cfg.model.no_decay_norms_and_biases
    )
    model, optimizer = strategy.prepare(accelerator, net, optimizer_factory)
    if cfg.compile:  # the net in place, inside ddp's wrapper, after sharding; compiled at its first call
        compile_net(net, per_block=strategy.compiles_per_block)
    replicas, rank = strategy.data_parallel(accelerator.process_index, accelerator.num_processes)
    scheduler = build(cfg.scheduler)(optimizer, total_steps=training_steps(cfg, data, replicas, rank))
    progress = Progress()
    # The strategy's objects come right after the progress: load_trained reads the first of them.
    accelerator.register_for_checkpointing(progress, *strategy.checkpoint_objects(model, optimizer), scheduler)
    checkpoints = Checkpoints(accelerator, run_dir / "checkpoints", strategy.sharded_state(model, optimizer))
    start = resume_point(accelerator, cfg, checkpoints)
    if start:
        checkpoints.load(start)
    if recovery:  # the micro-batch size that fitted before a restart, agreed by all processes
        recovery.load_state_dict(progress.oom_recovery, accelerator)

    failed = True
    try:
        if accelerator.is_main_process:
            write_atomically(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))  # others may read it
            start_wandb(accelerator, cfg, strategy, replicas, data.batch_size)
        if cfg.oom.find_batch_size and progress.found_batch_size:  # searched before this run was restarted
            data.batch_size = progress.found_batch_size
            accelerator.print(f"find_batch_size: global batch {data.batch_size}, found before the restart")
        elif cfg.oom.find_batch_size:
            finder = {**cfg.oom.batch_size_finder, "accumulation": accumulation(cfg)}
            find_batch_size(accelerator, strategy, model, optimizer, data, replicas, loss_fn, **finder)
            progress.found_batch_size = data.batch_size
            respan(scheduler, build(cfg.scheduler), training_steps(cfg, data, replicas, rank))  # of the batch found
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes))
        on_gpu, accumulate = accelerator.device.type == "cuda", accumulation(cfg)
        loaders = {
            split: data.loader(split, replicas, rank, on_gpu, per_node, accumulate) for split in data.split_names
        }
        fit(accelerator, cfg, strategy, model, optimizer, scheduler, loaders, progress, checkpoints, recovery)
        if cfg.test_after_fit and "test" in loaders:  # data=files: the test split is optional
            step, best = progress.global_step, checkpoints.folder / "best"
            accelerator.wait_for_everyone()  # the main process writes the checkpoints; the others read them
            if best.is_dir():  # else no validation ran: test the weights as they are
                checkpoints.load(best)
            log(accelerator, prefixed("test", evaluate(accelerator, model, loaders["test"])), step)
        failed = False
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
            accelerator.print(f"resume=false: starting afresh; removing the checkpoints in {checkpoints.folder}")
        if accelerator.is_main_process:
            forget_wandb_run(checkpoints.folder.parent)  # and a new wandb run
        checkpoints.clear()
        return None
    if checkpoints.last:
        accelerator.print(f"resuming from {checkpoints.last.resolve()} (resume=false starts afresh)")
    return checkpoints.last


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean loss of a batch (strategy=pipeline computes it per micro-batch on the last stage): cross-entropy over
    every target, class logits (B, C) with labels (B,), or a language model's (B, T, V) with tokens (B, T)."""
    return F.cross_entropy(logits.flatten(0, -2), target.flatten())


def fit(
    accelerator: Accelerator,
    cfg: DictConfig,
    strategy: Strategy,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    loaders: dict[str, Any],
    progress: Progress,
    checkpoints: Checkpoints,
    recovery: OOMRecovery | None,
) -> None:
    trainer, every_n_steps = cfg.trainer, cfg.checkpoint.every_n_steps
    step_loss = 0.0  # the sum of the optimizer step's micro-batch losses so far
    model.train()
    while progress.epoch < trainer.max_epochs and not done(progress, trainer.max_steps):
        epoch, loader = progress.epoch, loaders["train"]
        # This epoch's seeded shuffle, from the first batch not trained yet: a resumed run goes on with the
        # next batch, and its sampler (or stream) leaves out the ones before it (nothing is read twice).
        loader.load_state_dict(progress.loader or {"epoch": epoch, "samples_done": 0})
        for x, y in loader:
            x, y = to_device(accelerator, x, y)
            logged = (progress.global_step + 1) % trainer.log_every_n_steps == 0
            with accelerator.accumulate(model):
                if recovery:  # None: an out-of-memory error made it skip the batch (recovery refuses accumulation)
                    try:
                        loss = recovery.train_step(accelerator, model, x, y, loss_fn, progress.global_step)
                    except OutOfMemoryStop as stop:  # every process stops here together: save, then stop
                        progress.loader, progress.oom_recovery = loader.state_dict(), recovery.state_dict()
                        checkpoints.save(progress.global_step)
                        stop.checkpoint = checkpoints.last.resolve()
                        raise
                    progress.oom_recovery = recovery.state_dict()  # saved with the next checkpoint
                else:
                    loss = strategy.train_step(accelerator, model, x, y, loss_fn, logged=logged)
                if loss is not None:
                    step_loss = step_loss + loss
                if accelerator.sync_gradients:
                    if trainer.gradient_clip_val:
                        # The norm of the whole gradient, tensor-parallel shards too (the shared clip, as in the
                        # Lightning engine: accelerator.clip_grad_norm_ handles shards only in accelerate releases
                        # newer than this project's minimum, 1.10), of the 16-mixed gradients once unscaled.
                        accelerator.unscale_gradients()
                        clip_grad_norm_(model.parameters(), trainer.gradient_clip_val)
                    lr = current_lr(optimizer)
                    if loss is not None or not recovery:  # a skipped batch left no gradient: no step (16-mixed's
                        optimizer.step()  # gradient scaler refuses a step without its inf checks), as in Lightning
                    scheduler.step()  # once per optimizer step (not accelerate's prepared scheduler, which steps
                    optimizer.zero_grad()  # once per process unless the batch is split: not the global-batch meaning)
            if not accelerator.sync_gradients:
                continue
            if loss is not None and logged:
                # The only host sync of the step, and only on logging steps: the mean over the micro-batches and
                # all processes is the global batch's loss (processes that share a batch hold the same loss).
                loss = accelerator.reduce(step_loss / accumulation(cfg), "mean").item()
                metrics = {"train/loss": loss, "train/lr": lr, **strategy.step_metrics()}
                log(accelerator, {**metrics, "epoch": epoch}, progress.global_step)
            step_loss = 0.0
            progress.global_step += 1
            if done(progress, trainer.max_steps):
                break
            if every_n_steps and progress.global_step % every_n_steps == 0 and loader.batches_done < len(loader):
                progress.loader = loader.state_dict()
                checkpoints.save(progress.global_step)  # (the epoch's last batch: its end saves just after)
        else:  # a whole epoch: validate (as Lightning does, not after stopping at max_steps mid-epoch)
            progress.epoch, progress.loader = progress.epoch + 1, {}
            validate(accelerator, cfg, strategy, model, loaders["val"], progress, epoch, checkpoints)
            continue
        progress.loader = loader.state_dict()
        checkpoints.save(progress.global_step)  # stopped at trainer.max_steps


def training_steps(cfg: DictConfig, data: Data, replicas: int, rank: int) -> int:
    """Optimizer steps of the whole training, which the schedule spans (as Lightning's estimated_stepping_batches):
    trainer.max_steps, or the epochs' steps if fewer."""
    steps_per_epoch = len(data.loader("train", replicas, rank, accumulate=accumulation(cfg))) // accumulation(cfg)
    return total_steps(cfg.trainer.max_steps, cfg.trainer.max_epochs, steps_per_epoch)


def accumulation(cfg: DictConfig) -> int:
    """Micro-batches per optimizer step: data.batch_size stays the global batch, each is a part of it."""
    return cfg.trainer.accumulate_grad_batches


def done(progress: Progress, max_steps: int) -> bool:
    return 0 < max_steps <= progress.global_step


def validate(
    accelerator: Accelerator,
    cfg: DictConfig,
    strategy: Strategy,
    model: nn.Module,
    loader: Any,
    progress: Progress,
    epoch: int,
    checkpoints: Checkpoints,
) -> None:
    """Evaluate on the validation split, log, and checkpoint: the latest state, and the best by val/loss."""
    metrics = evaluate(accelerator, model, loader)
    log(accelerator, {**prefixed("val", metrics), "epoch": epoch}, progress.global_step)
    if cfg.epoch_metrics and accelerator.is_main_process:  # the search reads it to prune a trial
        append_epoch_metrics(cfg.epoch_metrics, epoch, prefixed("val", metrics))
    if cfg.oom.log_memory:
        log_device_memory(accelerator, strategy, progress.global_step)
    best = metrics["loss"] < progress.best_val_loss
    progress.best_val_loss = min(progress.best_val_loss, metrics["loss"])
    checkpoints.save(progress.global_step, best=best)


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: nn.Module, loader: Any) -> dict[str, float]:
    """Loss, accuracy and perplexity (exp of the loss) over the whole split, exact: per-target sums are reduced over
    the processes, then divided by the number of targets (every sample is evaluated once: the eval sampler does
    not repeat any)."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
    for x, y in loader:
        x, y = to_device(accelerator, x, y)
        with accelerator.autocast():
            logits = model(x)
        logits, y = logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)  # one row per target (token)
        totals[0] += F.cross_entropy(logits, y, reduction="sum")
        totals[1] += (logits.argmax(dim=-1) == y).sum()
        totals[2] += (y != IGNORED).sum()  # not the targets the eval sampler padded with (see data.EvalSampler)
    loss_sum, correct, count = accelerator.reduce(totals, "sum").tolist()
    model.train()
    return {"loss": loss_sum / count, "acc": correct / count, "perplexity": perplexity(loss_sum / count)}


def to_device(accelerator: Accelerator, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Host-to-device copies that overlap with compute on a GPU (the loaders pin their memory there)."""
    return [tensor.to(accelerator.device, non_blocking=True) for tensor in tensors]


def prefixed(split: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{split}/{name}": value for name, value in metrics.items()}


def log(accelerator: Accelerator, metrics: dict[str, float], step: int) -> None:
    """One wandb row (main process only). The step is a metric, as Lightning's WandbLogger logs it, so runs
    of both engines chart alike."""
    accelerator.log({**metrics, "trainer/global_step": step})


def start_wandb(accelerator: Accelerator, cfg: DictConfig, strategy: Strategy, replicas: int, batch: int) -> None:
    """One wandb run (main process), with the resolved config and how the run is laid out."""
    if not cfg.logger:
        return
    config = OmegaConf.to_container(cfg, resolve=True)
    processes = accelerator.num_processes
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", processes))
    config["run"] = {
        "engine": "accelerate",
        "strategy_preset": HydraConfig.get().runtime.choices["strategy"],
        "world_size": processes,
        "devices": per_node,
        "num_nodes": processes // per_node,
        "data_parallel_size": replicas,
        "per_device_batch_size": per_device_batch_size(batch, replicas, accumulation(cfg)),
        **strategy.describe(),
    }
    accelerator.init_trackers(cfg.logger.project, config=config)
    accelerator.get_tracker("wandb", unwrap=True).define_metric("*", step_metric="trainer/global_step")
