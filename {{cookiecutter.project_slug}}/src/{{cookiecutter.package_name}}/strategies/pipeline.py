"""strategy=pipeline: pipeline parallelism as a Lightning strategy, one process per stage.

Each process keeps only its stage of the net (the model's `pipeline_stage` hook) and trains it with a
torch.distributed.pipelining schedule, which cuts the batch into micro-batches so the stages overlap.
The schedule runs forward and backward in one call, so the strategy owns the training step (manual
optimization); validation, test, logging and checkpoints go through the usual Lightning paths.
Every stage reads the same batch: the pipeline is one data-parallel replica (pp x dp is not supported).
"""

import copy
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ..config import ConfigError

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class PipelineStrategy(DDPStrategy):
    """Pipeline-parallel training over all processes (stage i = global rank i).

    Launching, the process group (and its timeout) and devices come from DDPStrategy; nothing is wrapped
    in DistributedDataParallel because no two processes hold the same parameters.
    """

    data_parallel_size = 1  # read by the data module: every stage loads the whole batch
    data_parallel_rank = 0

    def __init__(
        self,
        microbatches: int = 4,
        schedule: str = "1f1b",
        split_points: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")
        super().__init__(**kwargs)
        self.microbatches = microbatches
        self.schedule = schedule
        self.split_points = list(split_points) if split_points is not None else None
        self._stage: TimedStage | None = None
        self._schedule: ScheduleGPipe | Schedule1F1B | None = None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # checkpoints hold the whole model: load once this process knows its stage

    @property
    def bubble_fraction(self) -> float:
        """Share of each step a stage idles while the pipeline fills and drains: (p - 1) / (m + p - 1)."""
        return (self.world_size - 1) / (self.microbatches + self.world_size - 1)

    def check_layout(self, trainer: L.Trainer, module: L.LightningModule, global_batch_size: int) -> None:
        """Refuse, before any process starts, a pipeline that cannot run."""
        stages, m = self.world_size, self.microbatches
        if stages < 2:
            raise ConfigError(f"strategy=pipeline runs one stage per process; trainer.devices={stages} gives 1, use 2+")
        if m < stages:
            raise ConfigError(
                f"strategy.microbatches={m} is fewer than the {stages} pipeline stages, so stages would only take "
                f"turns; use at least {stages} (more micro-batches, smaller bubble)"
            )
        if global_batch_size % m:
            raise ConfigError(
                f"data.batch_size={global_batch_size} does not split into strategy.microbatches={m} equal "
                f"micro-batches; use a multiple of {m}"
            )
        if trainer.accumulate_grad_batches != 1 or trainer.gradient_clip_val:
            raise ConfigError(
                "strategy=pipeline does not support trainer.accumulate_grad_batches or trainer.gradient_clip_val; "
                "raise strategy.microbatches to save memory instead"
            )
        try:
            module.net.pipeline_stage(0, stages, self.split_points)
        except ValueError as err:
            raise ConfigError(f"strategy=pipeline: {err}") from err

    def setup(self, trainer: L.Trainer) -> None:
        self.accelerator.setup(trainer)
        module = self.lightning_module
        if not isinstance(module.net, PipelinedNet):  # setup runs again for trainer.test
            stage = module.net.pipeline_stage(self.global_rank, self.world_size, self.split_points)
            module.net = PipelinedNet(stage, self.global_rank, self.world_size)  # the rest of the net is freed
        module.automatic_optimization = False  # training_step below runs forward, backward and the step
        self.precision_plugin.convert_module(module)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._stage = TimedStage(module.net.stage, self.global_rank, self.world_size, self.root_device)
            self._schedule = SCHEDULES[self.schedule](self._stage, self.microbatches, loss_fn=module.loss)
            self._log_layout(trainer)
        self.setup_precision_plugin()

    def _log_layout(self, trainer: L.Trainer) -> None:
        """Record the split (parameters per stage: is it balanced?) and the theoretical bubble."""
        parameters = [None] * self.world_size
        dist.all_gather_object(parameters, sum(p.numel() for p in self.lightning_module.net.stage.parameters()))
        layout = {
            "stages": self.world_size,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "parameters_per_stage": parameters,
            "bubble_fraction": round(self.bubble_fraction, 4),
        }
        for logger in trainer.loggers:
            logger.log_hyperparams({"pipeline": layout})
        if self.is_global_zero:
            print(f"pipeline: {layout} (bubble = (stages - 1) / (microbatches + stages - 1))")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        module, stage = self.lightning_module, self._stage
        x, y = batch
        optimizer = module.optimizers()
        optimizer.zero_grad()
        losses: list[torch.Tensor] | None = [] if stage.is_last else None
        stage.busy_seconds, start = 0.0, time.perf_counter()
        # The first stage feeds the inputs, the last one the targets; gradients are averaged over micro-batches.
        self._schedule.step(*([x] if stage.is_first else []), target=y if stage.is_last else None, losses=losses)
        idle = 1.0 - stage.busy_seconds / (time.perf_counter() - start)
        optimizer.step()

        # One all_gather brings every stage's idle share and the last stage's loss (the mean of the micro-batch
        # means = the mean over the batch, as on one device) to every process; all log the same values, and
        # rank 0's logger sends them once, at this global step.
        loss = torch.stack(losses).mean().item() if losses is not None else 0.0
        mine = torch.tensor([loss, idle], device=self.root_device)
        stats = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(stats, mine)
        for rank, stage_stats in enumerate(stats):
            module.log(f"pipeline/idle_fraction/stage{rank}", stage_stats[1], on_step=True, on_epoch=False)
        return stats[-1][0]

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """This stage's part of the model, under the single-device names (net.blocks.2..., not net.stage...)."""
        return {single_device_name(key): value for key, value in self.lightning_module.state_dict().items()}

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        """Load this stage's part of a whole-model checkpoint."""
        own = {single_device_name(key): key for key in self.lightning_module.state_dict()}
        state = {own[key]: value for key, value in checkpoint["state_dict"].items() if key in own}
        self.lightning_module.load_state_dict(state, strict=strict)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        # Each stage saves its part: its parameters and optimizer state (what resuming this pipeline reads) ...
        self.checkpoint_io.save_checkpoint(checkpoint, stage_path(filepath, self.global_rank), storage_options)
        # ... and rank 0 the whole model and optimizer state under single-device names and order, which any
        # preset (single too) can load, for evaluation or to resume training.
        parts = [None] * self.world_size if self.is_global_zero else None
        dist.gather_object((checkpoint["state_dict"], checkpoint.get("optimizer_states")), parts, dst=0)
        if self.is_global_zero:
            whole = dict(checkpoint, state_dict={key: value for part, _ in parts for key, value in part.items()})
            if "optimizer_states" in checkpoint:  # absent from weights-only checkpoints
                per_stage = [optimizer_states for _, optimizer_states in parts]
                whole["optimizer_states"] = [merge_optimizer_states(states) for states in zip(*per_stage, strict=True)]
            if "loops" in checkpoint:
                whole["loops"] = with_automatic_step_count(checkpoint["loops"])
            self.checkpoint_io.save_checkpoint(whole, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only)
        stage_file = stage_path(checkpoint_path, self.global_rank)
        if "optimizer_states" in checkpoint and stage_file.is_file():  # resuming: this stage's optimizer state
            stage_checkpoint = self.checkpoint_io.load_checkpoint(stage_file, weights_only=weights_only)
            checkpoint["optimizer_states"] = stage_checkpoint["optimizer_states"]
        return checkpoint

    def remove_checkpoint(self, filepath: Any) -> None:
        super().remove_checkpoint(filepath)
        self.checkpoint_io.remove_checkpoint(stage_path(filepath, self.global_rank))


def stage_path(checkpoint_path: Any, stage: int) -> Path:
    """Where a stage keeps its part of a checkpoint: last.ckpt -> last.ckpt.stage1."""
    return Path(f"{checkpoint_path}.stage{stage}")


def merge_optimizer_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One optimizer's state over the whole model, from its stages' states.

    Stages hold consecutive parameters in model order, so within each parameter group the single-device
    optimizer sees stage 0's parameters, then stage 1's, ...; they are renumbered in that order.
    """
    merged: dict[str, Any] = {"state": {}, "param_groups": []}
    index = 0
    for groups in zip(*(state["param_groups"] for state in states), strict=True):
        params = []
        for state, group in zip(states, groups, strict=True):
            for param in group["params"]:
                if param in state["state"]:
                    merged["state"][index] = state["state"][param]
                params.append(index)
                index += 1
        merged["param_groups"].append({**groups[0], "params": params})
    return merged


def with_automatic_step_count(loops: dict[str, Any]) -> dict[str, Any]:
    """Loop state whose optimizer step count is also where automatic optimization (every other preset) reads
    it, so that a single-device run resuming the consolidated checkpoint continues at the same global step."""
    loops = copy.deepcopy(loops)
    fit_loop = loops["fit_loop"]
    steps = fit_loop["epoch_loop.manual_optimization.optim_step_progress"]
    fit_loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"] = copy.deepcopy(steps)
    return loops


def single_device_name(key: str) -> str:
    return key.replace("net.stage.", "net.", 1) if key.startswith("net.stage.") else key


class TimedStage(PipelineStage):
    """A PipelineStage that adds up its compute time; the rest of a step it waits for other stages."""

    busy_seconds = 0.0

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self._busy():
            return super().forward_one_chunk(*args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self._busy():
            return super().backward_one_chunk(*args, **kwargs)

    @contextmanager
    def _busy(self) -> Iterator[None]:
        start = self._now()
        try:
            yield
        finally:
            self.busy_seconds += self._now() - start

    def _now(self) -> float:
        if self.device.type == "cuda":  # GPU kernels run asynchronously: wait for them to time them
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class PipelinedNet(nn.Module):
    """The LightningModule's `net` under strategy=pipeline: this process's stage of the network.

    forward() (validation, test, predict) passes the batch through all stages with send/recv and returns
    the last stage's output on every process, so the LightningModule's metrics work unchanged. Training
    does not call it: the schedule drives the stage directly.
    """

    def __init__(self, stage: nn.Module, index: int, num_stages: int) -> None:
        super().__init__()
        self.stage = stage
        self.index = index
        self.last = num_stages - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index > 0:
            x = _recv(self.index - 1, x.device)
        out = self.stage(x)
        if self.index < self.last:
            _send(out, self.index + 1)
        return _broadcast(out if self.index == self.last else None, self.last, x.device)


# Evaluation batches can have any size, so each tensor is preceded by a header: dtype, rank, shape.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MAX_DIMS = 6


def _header(tensor: torch.Tensor) -> torch.Tensor:
    shape = [*tensor.shape, *[0] * (_MAX_DIMS - tensor.dim())]
    return torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *shape], device=tensor.device)


def _empty_like_header(header: torch.Tensor, device: torch.device) -> torch.Tensor:
    dtype, dims, *shape = header.tolist()
    return torch.empty(shape[:dims], dtype=_DTYPES[dtype], device=device)


def _send(tensor: torch.Tensor, dst: int) -> None:
    dist.send(_header(tensor), dst)
    dist.send(tensor.contiguous(), dst)


def _recv(src: int, device: torch.device) -> torch.Tensor:
    header = torch.zeros(2 + _MAX_DIMS, dtype=torch.long, device=device)
    dist.recv(header, src)
    tensor = _empty_like_header(header, device)
    dist.recv(tensor, src)
    return tensor


def _broadcast(tensor: torch.Tensor | None, src: int, device: torch.device) -> torch.Tensor:
    header = _header(tensor) if tensor is not None else torch.zeros(2 + _MAX_DIMS, dtype=torch.long, device=device)
    dist.broadcast(header, src)
    if tensor is None:
        tensor = _empty_like_header(header, device)
    dist.broadcast(tensor, src)
    return tensor
