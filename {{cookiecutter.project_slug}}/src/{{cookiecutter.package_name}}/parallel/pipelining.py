"""Pipeline parallelism that needs no training engine: the stages, the schedules, one training step, and the
pieces that make a pipeline look like one model (evaluation through all stages, single-device names in checkpoints).

Each process keeps only its stage of the net (cut as its `Split` says, model_split.py) and trains it with a
torch.distributed.pipelining schedule, which cuts the batch into micro-batches so the stages overlap.
Every stage reads the same batch: the pipeline is one data-parallel replica (pp x dp is not supported).
"""

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ..errors import ConfigError
from .batchnorm import split_problem
from .split import find_split, pipeline_stage, tied_across_stages

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Share of each step a stage idles while the pipeline fills and drains: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def check_pipeline(stages: int, microbatches: int, global_batch_size: int, net: nn.Module, split_points: Any) -> None:
    """Refuse, before any process starts, a pipeline that cannot run."""
    find_split(net, "pipeline")  # first: a model without a split cannot be pipelined whatever the layout
    if problem := split_problem(net, "pipeline"):
        raise ConfigError(problem)
    if stages < 2:
        raise ConfigError(f"strategy=pipeline runs one stage per process; {stages} process given, use 2+")
    if microbatches < stages:
        raise ConfigError(
            f"strategy.microbatches={microbatches} is fewer than the {stages} pipeline stages, so stages would only "
            f"take turns; use at least {stages} (more micro-batches, smaller bubble)"
        )
    if global_batch_size % microbatches:
        raise ConfigError(
            f"data.batch_size={global_batch_size} does not split into strategy.microbatches={microbatches} equal "
            f"micro-batches; use a multiple of {microbatches}"
        )
    try:
        pipeline_stage(net, 0, stages, split_points)
    except ConfigError:  # no split: already one line naming what to implement
        raise
    except ValueError as err:
        raise ConfigError(f"strategy=pipeline: {err}") from err


class Pipeline:
    """Trains this process's stage (a PipelinedNet) with a schedule; stage i = global rank i."""

    def __init__(
        self,
        net: "PipelinedNet",
        device: torch.device,
        microbatches: int,
        schedule: str,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")
        self.net, self.device = net, device
        self.rank, self.stages = net.index, net.last + 1
        self.stage = TimedStage(net.stage, self.rank, self.stages, device)
        self.schedule = SCHEDULES[schedule](self.stage, microbatches, loss_fn=loss_fn)
        # Tied weights held by several stages: a process group per set of stages (every process creates each,
        # in the same order), and the copies this stage holds.
        self.tied = []
        for stages, names in net.tied:
            group = dist.new_group(stages)
            if self.rank in stages:
                self.tied.append((net.stage.get_parameter(names[self.rank]), group))

    def parameter_counts(self) -> list[int]:
        """Parameters held by each stage (is the split balanced?), on every process."""
        counts = [None] * self.stages
        dist.all_gather_object(counts, sum(p.numel() for p in self.net.stage.parameters()))
        return counts

    def train_step(
        self, x: torch.Tensor, y: torch.Tensor, measure: bool = True
    ) -> tuple[torch.Tensor, list[float] | None]:
        """Forward and backward of one batch through all stages (gradients averaged over micro-batches); the
        caller steps the optimizer. Returns the batch's loss (the mean of the last stage's micro-batch means = the
        mean over the batch, as on one device), a tensor: nothing here waits for the GPU.

        `measure` (the steps that are logged): the loss, and each stage's idle share of the step, on every process
        (one all_gather, after waiting for this stage's work). Other steps neither time nor communicate: only the
        last stage has the loss (the others return NaN), and the idle shares are None."""
        stage = self.stage
        losses: list[torch.Tensor] | None = [] if stage.is_last else None
        stage.timing = measure
        start = time.perf_counter()
        # The first stage feeds the inputs, the last one the targets.
        self.schedule.step(*([x] if stage.is_first else []), target=y if stage.is_last else None, losses=losses)
        for param, group in self.tied:  # each copy's gradient is its stage's uses: their sum is one device's
            dist.all_reduce(param.grad, group=group)  # gradient, so the copies take the same step and stay equal
        nan = torch.full((), math.nan, device=self.device)
        loss = torch.stack(losses).detach().float().mean() if losses is not None else nan
        if not measure:
            return loss, None
        busy = stage.take_busy_seconds()  # on a GPU: after this stage's kernels of the step have run
        idle = 1.0 - busy / (time.perf_counter() - start)
        mine = torch.stack([loss, torch.tensor(idle, device=self.device)])
        stats = [torch.empty_like(mine) for _ in range(self.stages)]
        dist.all_gather(stats, mine)
        return stats[-1][0], [float(stage_stats[1]) for stage_stats in stats]


# A stage's optimizer state keyed by parameter name and flattened ("state.<name>.exp_avg", ...) in checkpoints,
# which every stage writes its part of (torch.distributed.checkpoint): the stages hold different parameters, so no
# two stages write the same entry (an optimizer's own state_dict numbers the parameters of every stage from 0).
STAGE_OPTIMIZER_STATE = StateDictOptions(flatten_optimizer_state_dict=True)


def single_device_name(key: str) -> str:
    """A stage's parameter name as one device names it: [net.]stage.blocks.2.x -> [net.]blocks.2.x."""
    prefix, found, rest = key.partition("stage.")
    return prefix + rest if found and prefix in ("", "net.") else key


class TimedStage(PipelineStage):
    """A PipelineStage that adds up its compute time while `timing` (the steps that are measured); the rest of
    a step it waits for other stages.

    On a GPU the kernels run asynchronously: each chunk is timed by two CUDA events, read once at the end of
    the step (`take_busy_seconds`), so timing never waits in the middle of the schedule's transfers.
    """

    timing = False
    busy_seconds = 0.0
    _events: list[tuple[torch.cuda.Event, torch.cuda.Event]]

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self._busy():
            return super().forward_one_chunk(*args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self._busy():
            return super().backward_one_chunk(*args, **kwargs)

    @contextmanager
    def _busy(self) -> Iterator[None]:
        if not self.timing:
            yield
            return
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self.__dict__.setdefault("_events", []).append((start, end))
            return
        start_time = time.perf_counter()
        try:
            yield
        finally:
            self.busy_seconds += time.perf_counter() - start_time

    def take_busy_seconds(self) -> float:
        """Compute seconds since the last call (waits for this step's last CUDA event, not for each one)."""
        events, self._events = self.__dict__.get("_events", []), []
        if events:
            events[-1][1].synchronize()
        busy = self.busy_seconds + sum(start.elapsed_time(end) for start, end in events) / 1000
        self.busy_seconds = 0.0
        return busy


class PipelinedNet(nn.Module):
    """The net under strategy=pipeline: this process's stage of the network.

    forward() (validation, test, predict) passes the batch through all stages with send/recv and returns
    the last stage's output on every process, so the metrics code works unchanged. Training does not call
    it: the schedule drives the stage directly.
    """

    def __init__(
        self, stage: nn.Module, index: int, num_stages: int, tied: list[tuple[list[int], dict[int, str]]] = ()
    ) -> None:
        super().__init__()
        self.stage = stage
        self.index = index
        self.last = num_stages - 1
        self.tied = list(tied)  # parameters several stages hold: (those stages, each one's name for it)

    @classmethod
    def of(cls, net: nn.Module, rank: int, stages: int, split_points: Sequence[int] | None = None) -> "PipelinedNet":
        """Stage `rank` of `net`, cut as its Split says; the rest of the net is not kept. Each stage holds its own
        copy of a tied parameter (every process built the whole net from the same seed: equal copies)."""
        tied = tied_across_stages(net, stages, split_points)
        return cls(pipeline_stage(net, rank, stages, split_points), rank, stages, tied)

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
