"""Pipeline parallelism that needs no training engine: the stages, the schedules, one training step, and the
pieces that make a pipeline look like one model (evaluation through all stages, single-device names in checkpoints).

Each process keeps only its stage of the net (cut as its `Split` says, model_split.py) and trains it with a
torch.distributed.pipelining schedule, which cuts the batch into micro-batches so the stages overlap.
Every stage of a pipeline reads the same batch. With `strategy.data_parallel_size=D` the processes form D pipelines
side by side (process r: stage r % stages of pipeline r // stages), each on its slice of the global batch; each
stage's gradients are averaged over the pipelines by DDP around the stage (torch's schedules defer its all-reduce
to the last micro-batch's backward).
"""

import math
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel

from ..errors import ConfigError
from .batchnorm import split_problem
from .split import find_split, pipeline_stage, tied_across_stages

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def check_pipeline_settings(unknown: Collection[str]) -> None:
    """Refuse settings strategy=pipeline does not have (e.g. +strategy.tensor_parallel_size=2), which a launcher's
    keyword arguments would otherwise take in silence (raises ValueError: the config builder's one line)."""
    if unknown:
        names = ", ".join(f"strategy.{name}" for name in sorted(unknown))
        tensor = "tensor_parallel_size" in unknown
        hint = "; tensor parallelism is strategy=model_parallel's (not combined with a pipeline)" if tensor else ""
        raise ValueError(
            f"strategy=pipeline has no {names}; its settings: microbatches, schedule, split_points, "
            f"data_parallel_size (pipelines side by side){hint}"
        )


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Share of each step a stage idles while the pipeline fills and drains: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


@dataclass(frozen=True)
class PipelineLayout:
    """`replicas` pipelines of `stages` stages side by side: process r runs stage r % stages of pipeline r // stages
    (a pipeline's stages on neighbouring ranks, so on one machine first). The one place that maps ranks to stages
    and pipelines: the checks, the process groups, the data slices and the means over pipelines all read it."""

    stages: int
    replicas: int = 1

    @classmethod
    def over(cls, processes: int, replicas: int = 1) -> "PipelineLayout":
        return cls(max(processes // max(replicas, 1), 1), replicas)

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def pipeline_of(self, rank: int) -> int:  # also the slice of the global batch the rank's pipeline reads
        return rank // self.stages

    def rank(self, pipeline: int, stage: int) -> int:
        return pipeline * self.stages + stage

    def pipeline_ranks(self, pipeline: int, stages: Sequence[int] | None = None) -> list[int]:
        return [self.rank(pipeline, stage) for stage in (range(self.stages) if stages is None else stages)]

    def stage_ranks(self, stage: int) -> list[int]:
        return [self.rank(pipeline, stage) for pipeline in range(self.replicas)]


def check_pipeline(
    processes: int, microbatches: int, global_batch_size: int, net: nn.Module, split_points: Any, replicas: int = 1
) -> None:
    """Refuse, before any process starts, a pipeline that cannot run: `replicas` pipelines over `processes`."""
    find_split(net, "pipeline")  # first: a model without a split cannot be pipelined whatever the layout
    if problem := split_problem(net, "pipeline"):
        raise ConfigError(problem)
    if replicas < 1 or processes % replicas:
        valid = ", ".join(str(d) for d in range(1, processes + 1) if processes % d == 0)
        raise ConfigError(
            f"strategy.data_parallel_size={replicas} must divide the {processes} processes (pipelines x stages); "
            f"valid: {valid}"
        )
    stages = PipelineLayout.over(processes, replicas).stages
    if stages < 2 and replicas > 1:
        raise ConfigError(
            f"strategy=pipeline with strategy.data_parallel_size={replicas} over {processes} processes leaves "
            f"{stages} stage per pipeline; use 2+ processes per pipeline"
        )
    if stages < 2:
        raise ConfigError(f"strategy=pipeline runs one stage per process; {stages} process given, use 2+")
    if microbatches < stages:
        raise ConfigError(
            f"strategy.microbatches={microbatches} is fewer than the {stages} pipeline stages, so stages would only "
            f"take turns; use at least {stages} (more micro-batches, smaller bubble)"
        )
    if global_batch_size % (microbatches * replicas):
        pipelines = f" for each of {replicas} pipelines" if replicas > 1 else ""
        raise ConfigError(
            f"data.batch_size={global_batch_size} does not split into strategy.microbatches={microbatches} equal "
            f"micro-batches{pipelines}; use a multiple of {microbatches * replicas}"
        )
    try:
        pipeline_stage(net, 0, stages, split_points)
    except ConfigError:  # no split: already one line naming what to implement
        raise
    except ValueError as err:
        raise ConfigError(f"strategy=pipeline: {err}") from err


class Pipeline:
    """Trains this process's stage (a PipelinedNet) with a schedule."""

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
        self.net, self.device, self.layout = net, device, net.layout
        self.rank, self.stages, self.replicas = net.index, net.layout.stages, net.layout.replicas
        submodule = net.stage
        if self.replicas > 1:  # the same stage of every pipeline: DDP averages its gradients over them
            device_ids = [device] if device.type == "cuda" else None
            submodule = DistributedDataParallel(net.stage, device_ids=device_ids, process_group=net.replica_group)
        self.stage = TimedStage(submodule, self.rank, self.stages, device, group=net.group)
        self.schedule = SCHEDULES[schedule](self.stage, microbatches, loss_fn=loss_fn)
        # The copies of tied weights this stage holds, each with the group of the stages holding one (PipelinedNet.of)
        self.tied = [(net.stage.get_parameter(name), group) for name, group in net.tied]

    def parameter_counts(self) -> list[int]:
        """Parameters held by each stage (is the split balanced?), on every process."""
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, sum(p.numel() for p in self.net.stage.parameters()))
        return counts[: self.stages]

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
        by_stage = self.means_by_stage(torch.stack([loss, torch.tensor(idle, device=self.device)]))
        return by_stage[-1][0], [float(stage_stats[1]) for stage_stats in by_stage]

    def mean_over_pipelines(self, values: torch.Tensor) -> torch.Tensor:
        """`values` of the last stages (the others' are NaN: they have no loss), averaged over the pipelines, on
        every process: the mean over the global batch."""
        return self.means_by_stage(values)[-1]

    def means_by_stage(self, mine: torch.Tensor) -> torch.Tensor:
        """Every process's `mine` (same shape everywhere), averaged over the pipelines: one row per stage, on every
        process (one all_gather). The last stage's row holds the loss: each pipeline's is the mean over its slice of
        the global batch, and the slices are equal, so their mean is the mean over the global batch."""
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine.contiguous())
        return torch.stack(gathered).view(self.replicas, self.stages, *mine.shape).mean(dim=0)


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
        self,
        stage: nn.Module,
        index: int,
        layout: PipelineLayout,
        tied: Sequence[tuple[str, Any]] = (),
        replica: int = 0,
        groups: tuple[Any, Any] = (None, None),
    ) -> None:
        """`groups`: this pipeline's processes and this stage's in every pipeline (pipeline_groups), None for the
        whole world and for no other pipeline."""
        super().__init__()
        self.stage = stage
        self.index, self.layout, self.replica = index, layout, replica
        self.tied = list(tied)  # this stage's copies of parameters several stages hold: (its name, their group)
        # Each of those copies' names at the other stages: a checkpoint may hold its state under one of those only
        self.aliases: dict[str, list[str]] = {}
        self.ranks = layout.pipeline_ranks(replica)  # the processes of this pipeline's stages
        self.group, self.replica_group = groups

    @classmethod
    def of(
        cls,
        net: nn.Module,
        rank: int,
        processes: int,
        split_points: Sequence[int] | None = None,
        replicas: int = 1,
    ) -> "PipelinedNet":
        """Process `rank`'s stage of `net` (of `replicas` pipelines over `processes`), cut as its Split says; the
        rest of the net is not kept. Each stage holds its own copy of a tied parameter (every process built the
        whole net from the same seed: equal copies)."""
        layout = PipelineLayout.over(processes, replicas)
        index, replica = layout.stage_of(rank), layout.pipeline_of(rank)
        stage = pipeline_stage(net, index, layout.stages, split_points)
        groups = pipeline_groups(layout, rank)
        across = tied_across_stages(net, layout.stages, split_points)
        pipelined = cls(stage, index, layout, tied_groups(layout, across, rank), replica, groups)
        for _, names in across:
            if index in names:
                pipelined.aliases[names[index]] = [name for holder, name in names.items() if holder != index]
        return pipelined

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index > 0:
            x = _recv(self.ranks[self.index - 1], x.device)
        out = self.stage(x)
        last = self.layout.stages - 1
        if self.index < last:
            _send(out, self.ranks[self.index + 1])
        return _broadcast(out if self.index == last else None, self.ranks[-1], x.device, self.group)


def pipeline_groups(layout: PipelineLayout, rank: int) -> tuple[Any, Any]:
    """The process groups of `rank` with several pipelines: its pipeline's stages, and its stage in every pipeline.
    Every process creates every group, in the same order (torch.distributed's rule); one pipeline needs none."""
    if layout.replicas == 1:
        return None, None
    pipelines = [dist.new_group(layout.pipeline_ranks(pipeline)) for pipeline in range(layout.replicas)]
    stages = [dist.new_group(layout.stage_ranks(stage)) for stage in range(layout.stages)]
    return pipelines[layout.pipeline_of(rank)], stages[layout.stage_of(rank)]


def tied_groups(layout: PipelineLayout, tied: Sequence[tuple[list[int], dict[int, str]]], rank: int) -> list:
    """For each parameter several stages hold ((those stages, each one's name for it), tied_across_stages), a process
    group of those stages in every pipeline, created by every process in the same order; `rank`'s copies:
    [(its name for the parameter, the group that adds up the copies' gradients)]."""
    mine = []
    for stages, names in tied:
        for pipeline in range(layout.replicas):
            group = dist.new_group(layout.pipeline_ranks(pipeline, stages))
            if pipeline == layout.pipeline_of(rank) and layout.stage_of(rank) in stages:
                mine.append((names[layout.stage_of(rank)], group))
    return mine


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


def _broadcast(tensor: torch.Tensor | None, src: int, device: torch.device, group: Any = None) -> torch.Tensor:
    header = _header(tensor) if tensor is not None else torch.zeros(2 + _MAX_DIMS, dtype=torch.long, device=device)
    dist.broadcast(header, src, group=group)
    if tensor is None:
        tensor = _empty_like_header(header, device)
    dist.broadcast(tensor, src, group=group)
    return tensor
