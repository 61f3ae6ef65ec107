"""Pipeline parallelism that needs no training engine: the stages, the schedules, one training step, and the
pieces that make a pipeline look like one model (evaluation through all stages, single-device names in checkpoints).

Each process keeps only its stage of the net (cut as its `Split` says, parallel/split.py) and trains it with a
torch.distributed.pipelining schedule, which cuts the batch into micro-batches so the stages overlap.
Every stage of a pipeline reads the same batch. With `strategy.data_parallel_size=D` the processes form D pipelines
side by side, each on its slice of the global batch; each stage's gradients are averaged over the pipelines (by DDP
around the stage, whose all-reduce torch's schedules defer to the last micro-batch's backward; after the step where
DDP cannot: several stages per process, or tensor-parallel shards). With `strategy.tensor_parallel_size=T` each
position of a pipeline is T processes that shard its blocks by the Split's plan. PipelineLayout maps the ranks.
The looped schedules give each process several stages (`stages_per_process`, V): the net is cut into P x V stages
for P positions, stage s at position s % P (interleaved_1f1b), or in a V (zbv: position p holds stages p and
2P - 1 - p), so that a process idles less while the pipeline fills and drains.
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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import generate_stage_to_rank_mapping
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module
from torch.nn.parallel import DistributedDataParallel

from ..errors import ConfigError, TooFewProcesses
from .batchnorm import split_problem
from .layout import Layout
from .sharding import check_tensor_parallel
from .split import Chain, find_split, pipeline_stage, tensor_parallel_plan, tied_across_stages

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zbv": ScheduleZBVZeroBubble,
}
LOOPED = ("interleaved_1f1b", "zbv")  # several stages per process; the others one


def check_stages_per_process(schedule: str, given: int | None) -> int:
    """How many stages each process runs under `schedule` (`given`: strategy.stages_per_process, None: the
    schedule's own). Raises ValueError (the config builder's one line) where the schedule cannot run it."""
    if schedule not in SCHEDULES:
        raise ValueError(f"strategy.schedule={schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")
    number = given if given is not None else 2 if schedule in LOOPED else 1
    fits = {"zbv": number == 2, "interleaved_1f1b": number >= 2}.get(schedule, number == 1)
    if isinstance(number, bool) or not isinstance(number, int) or not fits:
        valid = {"zbv": "2", "interleaved_1f1b": "2 or more"}.get(schedule, "1 (interleaved_1f1b and zbv run more)")
        raise ValueError(
            f"strategy.stages_per_process={given} does not fit strategy.schedule={schedule}; valid: {valid}"
        )
    return number


def split_backward_blocker(compile: bool, activation_checkpointing: str) -> str:
    """The setting that stops zbv ('' where none does): zbv splits each backward into its input and weight gradients,
    two backwards through each block, which torch.compile and torch's selective activation checkpointing cannot
    take (torch's own checks, mid-step)."""
    if compile:
        return "compile=true"
    return "activation_checkpointing=selective" if activation_checkpointing == "selective" else ""


def check_split_backward(schedule: str, compile: bool, activation_checkpointing: str) -> None:
    """Refuse zbv where split_backward_blocker finds a setting that stops it, naming what to give instead."""
    blocker = split_backward_blocker(compile, activation_checkpointing) if schedule == "zbv" else ""
    cannot, instead = {
        "compile=true": ("a compiled block cannot", "compile=false"),
        "activation_checkpointing=selective": (
            "torch's selective activation checkpointing cannot (it allows one backward per block)",
            "activation_checkpointing=full or none",
        ),
    }.get(blocker, ("", ""))
    if blocker:
        raise ConfigError(
            f"strategy.schedule=zbv splits each backward in two, which {cannot}; give {instead}, or "
            "strategy.schedule=interleaved_1f1b"
        )


def check_pipeline_settings(unknown: Collection[str]) -> None:
    """Refuse settings strategy=pipeline does not have (e.g. +strategy.replicas=2, fsdp's), which a launcher's
    keyword arguments would otherwise take in silence (raises ValueError: the config builder's one line)."""
    if unknown:
        names = ", ".join(f"strategy.{name}" for name in sorted(unknown))
        raise ValueError(
            f"strategy=pipeline has no {names}; its settings: microbatches, schedule, stages_per_process, "
            "split_points, data_parallel_size (pipelines side by side), tensor_parallel_size (each stage's blocks "
            "sharded)"
        )


def check_pipeline_training(accumulate: int, clip: float | None) -> None:
    """What the schedule cannot do, refused naming the setting given: accumulation (its micro-batches are the
    accumulation) and gradient clipping (each stage holds part of the gradient, the norm is of the whole)."""
    if accumulate != 1:
        raise ConfigError(
            f"strategy=pipeline does not take trainer.accumulate_grad_batches={accumulate}: its schedule already runs "
            "each batch as strategy.microbatches micro-batches; raise that to save memory instead"
        )
    if clip:
        raise ConfigError(
            f"strategy=pipeline does not take trainer.gradient_clip_val={clip}: each stage holds part of the gradient "
            "whose norm clipping needs; leave it null"
        )


def bubble_fraction(processes: int, microbatches: int, schedule: str = "1f1b", per_process: int = 1) -> float:
    """Share of each step a process idles while the pipeline fills and drains, in theory: (p - 1) / (m + p - 1) for
    p processes and m micro-batches; a looped schedule's V stages per process fill it V times faster,
    (p - 1) / (V m + p - 1). zbv fills the bubble with the weight gradients' work: none is left when a forward, an
    input gradient and a weight gradient take the same time (ZB-V's premise; the measured idle share says how far a
    real model is from it)."""
    if schedule == "zbv":
        return 0.0
    return (processes - 1) / (per_process * microbatches + processes - 1)


@dataclass(frozen=True)
class PipelineLayout:
    """`replicas` pipelines of `stages` positions side by side, each position `tensor_parallel` processes that shard
    its blocks: one DeviceMesh (data_parallel, pipeline, tensor_parallel), process r at position (r // T) % stages of
    pipeline r // (stages T), tensor-parallel rank r % T (a position's processes, then a pipeline's, on neighbouring
    ranks: on one machine first). Each position runs the model stages `stages_at(position)`: one, or `per_process` of
    a looped schedule in `style` ("loop": stage s at position s % stages; "v": position p holds stages p and
    2 stages - 1 - p). The one place that maps ranks to stages and pipelines: the checks, the process groups, the data
    slices and the means over pipelines all read it."""

    stages: int
    replicas: int = 1
    per_process: int = 1
    style: str = "loop"
    tensor_parallel: int = 1

    @classmethod
    def over(
        cls, processes: int, replicas: int = 1, schedule: str = "1f1b", per_process: int = 1, tensor_parallel: int = 1
    ) -> "PipelineLayout":
        style = "v" if schedule == "zbv" else "loop"
        stages = max(processes // max(replicas * tensor_parallel, 1), 1)
        return cls(stages, replicas, per_process, style, tensor_parallel)

    def as_layout(self) -> Layout:  # in the vocabulary every preset shares (layout.py)
        return Layout(replicas=self.replicas, tensor_parallel=self.tensor_parallel, stages=self.stages)

    @property
    def num_stages(self) -> int:  # what the model is cut into
        return self.stages * self.per_process

    def position_of_stage(self, stage: int) -> int:
        return generate_stage_to_rank_mapping(self.stages, self.num_stages, style=self.style)[stage]

    def stages_at(self, position: int) -> list[int]:
        return [stage for stage in range(self.num_stages) if self.position_of_stage(stage) == position]

    @property
    def loss_position(self) -> int:  # the position holding the last stage, which computes the loss
        return self.position_of_stage(self.num_stages - 1)

    def stage_of(self, rank: int) -> int:  # the position in its pipeline
        return rank // self.tensor_parallel % self.stages

    def pipeline_of(self, rank: int) -> int:  # also the slice of the global batch the rank's pipeline reads
        return rank // (self.tensor_parallel * self.stages)

    def tensor_rank_of(self, rank: int) -> int:
        return rank % self.tensor_parallel

    def rank(self, pipeline: int, stage: int, tensor_rank: int = 0) -> int:
        return (pipeline * self.stages + stage) * self.tensor_parallel + tensor_rank

    def pipeline_ranks(self, pipeline: int, stages: Sequence[int] | None = None, tensor_rank: int = 0) -> list[int]:
        """The processes of `pipeline` (at `stages`, default all) that hold tensor-parallel shard `tensor_rank`."""
        return [self.rank(pipeline, stage, tensor_rank) for stage in (range(self.stages) if stages is None else stages)]

    def stage_ranks(self, stage: int, tensor_rank: int = 0) -> list[int]:
        return [self.rank(pipeline, stage, tensor_rank) for pipeline in range(self.replicas)]


def check_pipeline(
    processes: int,
    microbatches: int,
    global_batch_size: int,
    net: nn.Module,
    split_points: Any,
    replicas: int = 1,
    schedule: str = "1f1b",
    per_process: int = 1,
    tensor_parallel: int = 1,
    launch: str = "",
) -> None:
    """Refuse, before any process starts, a pipeline that cannot run: `replicas` pipelines over `processes`, each
    process running `per_process` stages of `schedule`, each position's blocks sharded over `tensor_parallel`.
    `launch`: how the engine starts several processes, said to a pipeline of one (TooFewProcesses)."""
    find_split(net, "pipeline")  # first: a model without a split cannot be pipelined whatever the layout
    if problem := split_problem(net, "pipeline"):
        raise ConfigError(problem)
    factors = f"strategy.data_parallel_size={replicas}"
    if tensor_parallel != 1:
        factors += f" x strategy.tensor_parallel_size={tensor_parallel}"
    if replicas < 1 or tensor_parallel < 1 or processes % (replicas * tensor_parallel):
        valid = ", ".join(str(d) for d in range(1, processes + 1) if processes % d == 0)
        shards = " x tensor-parallel shards" if tensor_parallel != 1 else ""
        raise ConfigError(
            f"{factors} must divide the {processes} processes (pipelines x stages{shards}); valid: {valid}"
        )
    stages = PipelineLayout.over(processes, replicas, tensor_parallel=tensor_parallel).stages
    if stages < 2 and (replicas > 1 or tensor_parallel > 1):
        raise ConfigError(
            f"strategy=pipeline with {factors} over {processes} processes leaves {stages} stage per pipeline; use "
            f"{2 * replicas * tensor_parallel}+ processes (2+ stages per pipeline)"
        )
    if stages < 2:
        raise TooFewProcesses(f"strategy=pipeline runs one stage per process; {stages} process given, use 2+", launch)
    if tensor_parallel > 1:
        check_tensor_parallel(net, tensor_parallel)  # the plan divides over the shards (heads, features)
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
    rounds = max(1, microbatches // stages)  # torch's interleaved 1F1B runs the micro-batches in equal rounds
    if schedule == "interleaved_1f1b" and microbatches % rounds:
        valid = ", ".join(str(m) for m in range(stages, 4 * stages + 1) if m % max(1, m // stages) == 0)
        raise ConfigError(
            f"strategy.microbatches={microbatches} does not fit strategy.schedule=interleaved_1f1b over {stages} "
            f"processes per pipeline (torch runs them in {microbatches} // {stages} = {rounds} equal rounds); valid: "
            f"{valid}, ..."
        )
    try:
        pipeline_stage(net, 0, stages * per_process, split_points)
    except ConfigError:  # no split: already one line naming what to implement
        raise
    except ValueError as err:
        factors = f" ({stages} processes x strategy.stages_per_process={per_process})" if per_process > 1 else ""
        raise ConfigError(f"strategy=pipeline: {err}{factors}") from err


class Pipeline:
    """Trains this process's stages (a PipelinedNet) with a schedule."""

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
        self.microbatches, self.schedule_name = microbatches, schedule
        self.rank, self.stages, self.replicas = net.index, net.layout.stages, net.layout.replicas
        held = net.layout.stages_at(net.index)
        self.first, self.last = 0 in held, net.layout.num_stages - 1 in held
        parts: list[nn.Module] = list(net.chunks)
        for part, stage in zip(parts, held, strict=True):
            if stage < net.layout.num_stages - 1:
                part.register_forward_hook(sent_with_gradient)
        # The same stage of every pipeline: DDP averages its gradients over them, during the last micro-batch's
        # backward. Several stages per process may share a parameter (zbv's first and last, tied), which two DDPs
        # would each average, and shards of tensor parallelism are DTensors, which DDP does not take; and gpipe runs
        # every micro-batch's forward before the first backward, which DDP's reducer counts twice (torch 2.13: an
        # internal assert at the second step): their gradients are averaged after the step instead
        # (average_over_pipelines).
        self.ddp = self.replicas > 1 and len(parts) == 1 and net.layout.tensor_parallel == 1 and schedule != "gpipe"
        if self.ddp:
            device_ids = [device] if device.type == "cuda" else None
            parts = [DistributedDataParallel(parts[0], device_ids=device_ids, process_group=net.replica_group)]
        self.modules, self.held, self.loss_fn = parts, held, loss_fn
        self.plan()
        self.shapes: tuple[torch.Size, torch.Size] | None = None  # of the batch the stages were planned for
        self.replanned = False
        # Where the pipelines agree on a change of shapes: on the host (a flag of a GPU collective, read back, would
        # wait for each step's end before the next could be queued)
        self.shapes_group = None
        if self.replicas > 1 and dist.get_backend() != "gloo":
            self.shapes_group = dist.new_group(backend="gloo")
        # The copies of tied weights this process holds, each with the group of the processes holding one
        self.tied = [([net.stage.get_parameter(name) for name in names], group) for names, group in net.tied]

    def plan(self) -> None:
        """This process's stages and their schedule. torch's stages size their buffers at their first step: a batch
        of another shape (sequences padded to each batch's longest) needs them planned again (train_step)."""
        num_stages = self.layout.num_stages
        self.parts = [
            TimedStage(part, i, num_stages, self.device, group=self.net.group)
            for part, i in zip(self.modules, self.held, strict=True)
        ]
        stages = self.parts if self.schedule_name in LOOPED else self.parts[0]
        self.schedule = SCHEDULES[self.schedule_name](stages, self.microbatches, loss_fn=self.loss_fn)

    def summary(self) -> dict[str, Any]:
        """How the net is pipelined, as both engines log it (the wandb config's `pipeline`, and a line): the split
        (parameters per stage: is it balanced?) and the theoretical bubble. A collective: every process calls it."""
        per_process = len(self.parts)
        return {
            "stages": self.stages,
            "stages_per_process": per_process,
            "pipelines": self.replicas,
            "tensor_parallel_size": self.layout.tensor_parallel,
            "microbatches": self.microbatches,
            "schedule": self.schedule_name,
            "parameters_per_stage": self.parameter_counts(),
            "bubble_fraction": round(
                bubble_fraction(self.stages, self.microbatches, self.schedule_name, per_process), 4
            ),
        }

    def parameter_counts(self) -> list[int]:
        """Parameters held by each process of a pipeline, its stages together (is the split balanced?), on every
        process."""
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, sum(p.numel() for p in self.net.stage.parameters()))
        return counts[: self.stages * self.layout.tensor_parallel : self.layout.tensor_parallel]

    def train_step(
        self, x: torch.Tensor, y: torch.Tensor, measure: bool = True
    ) -> tuple[torch.Tensor, list[float] | None]:
        """Forward and backward of one batch through all stages (gradients averaged over micro-batches); the
        caller steps the optimizer. Returns the batch's loss (the mean of the last stage's micro-batch means = the
        mean over the batch, as on one device), a tensor: nothing here waits for the GPU.

        `measure` (the steps that are logged): the loss, and each stage's idle share of the step, on every process
        (one all_gather, after waiting for this stage's work). Other steps neither time nor communicate: only the
        last stage has the loss (the others return NaN), and the idle shares are None."""
        shapes = (x.shape, y.shape)  # the same on every stage of a pipeline: they all load its slice of the batch
        if self.shapes_changed(shapes):
            if not self.replanned and dist.get_rank() == 0:
                seen = f" (x {list(self.shapes[0])}, then {list(x.shape)})" if shapes != self.shapes else ""
                print(
                    f"note: strategy=pipeline: batch shapes change{seen}: the stages plan their buffers again at each "
                    "change; padding to one length saves that"
                )
            self.replanned = True
            self.plan()
        self.shapes = shapes
        losses: list[torch.Tensor] | None = [] if self.last else None
        for part in self.parts:
            part.timing = measure
        start = time.perf_counter()
        # The first stage feeds the inputs, the last one the targets.
        self.schedule.step(*([x] if self.first else []), target=y if self.last else None, losses=losses)
        if self.replicas > 1 and not self.ddp:
            self.average_over_pipelines()
        for copies, group in self.tied:  # each copy's gradient is its stage's uses: their sum is one device's
            grad = torch.stack([copy.grad for copy in copies]).sum(dim=0)  # gradient, so the copies take the
            if group is not None:  # same step and stay equal
                dist.all_reduce(grad, group=group)
            for copy in copies:
                copy.grad.copy_(grad)
        nan = torch.full((), math.nan, device=self.device)
        loss = torch.stack(losses).detach().float().mean() if losses is not None else nan
        if not measure:
            return loss, None
        busy = sum(part.take_busy_seconds() for part in self.parts)  # on a GPU: after the step's kernels ran
        idle = 1.0 - busy / (time.perf_counter() - start)
        by_stage = self.means_by_stage(torch.stack([loss, torch.tensor(idle, device=self.device)]))
        return by_stage[self.layout.loss_position][0], [float(stage_stats[1]) for stage_stats in by_stage]

    def shapes_changed(self, shapes: tuple[torch.Size, torch.Size]) -> bool:
        """Whether this batch's shapes differ from the last one's. Several pipelines plan again together, when any
        of them sees a change: planning runs a stage's forward and backward, in which DDP averages the gradients
        over the pipelines (a collective; with one pipeline changing alone, the others would wait for it forever).
        That costs them a small all-reduce at every step, on the host."""
        changed = self.shapes is not None and shapes != self.shapes
        if self.replicas == 1:
            return changed
        flag = torch.full((), int(changed), device="cpu" if self.shapes_group else self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.shapes_group)
        return bool(flag.item())

    def average_over_pipelines(self) -> None:
        """Average this process's gradients over its position in every pipeline (one all-reduce of them all)."""
        grads = [local(param.grad) for param in self.net.stage.parameters() if param.grad is not None]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat, group=self.net.replica_group)
        flat /= self.replicas
        for grad, averaged in zip(grads, flat.split([grad.numel() for grad in grads]), strict=True):
            grad.copy_(averaged.view_as(grad))

    def mean_over_pipelines(self, values: torch.Tensor) -> torch.Tensor:
        """`values` of the last stages (the others' are NaN: they have no loss), averaged over the pipelines, on
        every process: the mean over the global batch."""
        return self.means_by_stage(values)[self.layout.loss_position]

    def means_by_stage(self, mine: torch.Tensor) -> torch.Tensor:
        """Every process's `mine` (same shape everywhere), averaged over the pipelines: one row per position, on
        every process (one all_gather). The loss position's row holds the loss: each pipeline's is the mean over its
        slice of the global batch, and the slices are equal, so their mean is the mean over the global batch."""
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine.contiguous())
        shape = (self.replicas, self.stages, self.layout.tensor_parallel, *mine.shape)
        return torch.stack(gathered).view(shape).mean(dim=(0, 2))  # a position's shards have the same loss


# A stage's optimizer state keyed by parameter name and flattened ("state.<name>.exp_avg", ...) in checkpoints,
# which every stage writes its part of (torch.distributed.checkpoint): the stages hold different parameters, so no
# two stages write the same entry (an optimizer's own state_dict numbers the parameters of every stage from 0).
STAGE_OPTIMIZER_STATE = StateDictOptions(flatten_optimizer_state_dict=True)


def sent_with_gradient(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    """A stage's output in training, made to ask for its gradient where nothing before it trains (frozen first
    stages): zbv splits each stage's backward in two, and torch (2.13) computes a stage's weight gradients from its
    input's, which the stage after a frozen one did not ask for. It trained nothing, in silence."""
    if torch.is_grad_enabled() and not output.requires_grad and output.is_floating_point():
        return output.requires_grad_()  # (a tensor no gradient reaches is a leaf)
    return output


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
    """The net under strategy=pipeline: this process's stages of the network (`stage`: every module it holds, under
    the single-device names; `chunks`: each of its stages, a looped schedule's several, sharing those modules).

    forward() (validation, test, predict) passes the batch through all stages with send/recv and returns
    the last stage's output on every process, so the metrics code works unchanged. Training does not call
    it: the schedule drives the stages directly.
    """

    def __init__(
        self,
        chunks: Sequence[nn.Module],
        index: int,
        layout: PipelineLayout,
        tied: Sequence[tuple[list[str], Any]] = (),
        replica: int = 0,
        groups: tuple[Any, Any] = (None, None),
        net: nn.Module | None = None,
        tensor_rank: int = 0,
    ) -> None:
        """`groups`: this pipeline's processes (of this tensor-parallel rank) and this position in every pipeline
        (pipeline_groups), None for the whole world and for no other pipeline. `net`: the whole net the chunks were
        cut from (several chunks)."""
        super().__init__()
        self.stage = chunks[0] if len(chunks) == 1 else Chain(net, [name for chunk in chunks for name in chunk.names])
        self.chunks = list(chunks)  # a plain list: not registered twice (state_dict: `stage`'s names only)
        self.index, self.layout, self.replica = index, layout, replica
        self.tied = list(tied)  # this process's copies of parameters several stages hold: (their names, the group)
        # Each of those copies' names at the other positions: a checkpoint may hold its state under one of those only
        self.aliases: dict[str, list[str]] = {}
        self.ranks = layout.pipeline_ranks(replica, tensor_rank=tensor_rank)  # this pipeline's processes, by position
        self.group, self.replica_group = groups

    @classmethod
    def of(
        cls,
        net: nn.Module,
        rank: int,
        processes: int,
        split_points: Sequence[int] | None = None,
        replicas: int = 1,
        schedule: str = "1f1b",
        per_process: int = 1,
        tensor_parallel: int = 1,
        device_type: str = "cpu",
    ) -> "PipelinedNet":
        """Process `rank`'s stages of `net` (of `replicas` pipelines over `processes`, `per_process` stages each,
        each position's blocks sharded over `tensor_parallel` processes by the Split's plan), cut as its Split says;
        the rest of the net is not kept. Each process holds its own copy of a tied parameter (every process built
        the whole net from the same seed: equal copies)."""
        layout = PipelineLayout.over(processes, replicas, schedule, per_process, tensor_parallel)
        index, replica = layout.stage_of(rank), layout.pipeline_of(rank)
        pipeline_group, replica_group, tensor_mesh = pipeline_groups(layout, rank, device_type)
        if tensor_mesh is not None:  # the whole net's blocks by the Split's plan, before the cut: its names
            parallelize_module(net, tensor_mesh, tensor_parallel_plan(net, "pipeline"))
        num_stages, held = layout.num_stages, layout.stages_at(index)
        chunks = [pipeline_stage(net, stage, num_stages, split_points) for stage in held]
        tied = tied_across_stages(net, num_stages, split_points)
        for stages, names in tied:  # a copy for each stage, also for two on this process (zbv's first and last):
            for stage in [stage for stage in stages if stage in held][1:]:  # torch's zbv loses one use's weight
                owner, _, attribute = names[stage].rpartition(".")  # gradient of a parameter two stages share
                module = chunks[held.index(stage)].get_submodule(owner)
                setattr(module, attribute, nn.Parameter(getattr(module, attribute).detach().clone()))
        tied_here = tied_groups(layout, tied, rank)
        groups = (pipeline_group, replica_group)
        pipelined = cls(chunks, index, layout, tied_here, replica, groups, net, layout.tensor_rank_of(rank))
        for stages, names in tied:
            for stage in set(stages) & set(held):
                pipelined.aliases[names[stage]] = [names[other] for other in stages if other != stage]
        return pipelined

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position, chunks = self.layout.position_of_stage, iter(self.chunks)
        last = self.layout.num_stages - 1
        for stage in range(last + 1):
            if position(stage) != self.index:
                continue
            if stage > 0 and position(stage - 1) != self.index:
                x = _recv(self.ranks[position(stage - 1)], x.device)
            x = next(chunks)(x)
            if stage < last and position(stage + 1) != self.index:
                _send(x, self.ranks[position(stage + 1)])
        loss_position = self.layout.loss_position
        return _broadcast(x if self.index == loss_position else None, self.ranks[loss_position], x.device, self.group)


def pipeline_groups(layout: PipelineLayout, rank: int, device_type: str) -> tuple[Any, Any, DeviceMesh | None]:
    """`rank`'s process groups with several pipelines or tensor parallelism, from the layout's one DeviceMesh: its
    pipeline's positions (of its tensor-parallel rank), its position in every pipeline, and its position's
    tensor-parallel mesh (None without). Every process creates them all, in the same order (torch.distributed's
    rule); one pipeline without tensor parallelism needs none (the world is the pipeline)."""
    if layout.replicas == layout.tensor_parallel == 1:
        return None, None, None
    sizes = (layout.replicas, layout.stages, layout.tensor_parallel)
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=("data_parallel", "pipeline", "tensor_parallel"))
    tensor = mesh["tensor_parallel"] if layout.tensor_parallel > 1 else None
    return mesh.get_group("pipeline"), mesh.get_group("data_parallel"), tensor


def tied_groups(layout: PipelineLayout, tied: Sequence[tuple[list[int], dict[int, str]]], rank: int) -> list:
    """For each parameter several stages hold (tied_across_stages: the stages, each one's name for it), `rank`'s
    copies (one per stage it runs) and the process group of the positions holding one in its pipeline (None where
    this process holds them all); every process creates every group, in the same order: [(names, group)]."""
    mine = []
    for stages, names in tied:
        positions = sorted({layout.position_of_stage(stage) for stage in stages})
        groups = {
            (pipeline, shard): dist.new_group(layout.pipeline_ranks(pipeline, positions, shard))
            for pipeline in range(layout.replicas)
            for shard in range(layout.tensor_parallel)
            if len(positions) > 1
        }
        here = [names[stage] for stage in stages if layout.position_of_stage(stage) == layout.stage_of(rank)]
        if here:
            mine.append((here, groups.get((layout.pipeline_of(rank), layout.tensor_rank_of(rank)))))
    return mine


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of `tensor` (a DTensor's local shard, which shares its storage), or `tensor`."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


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
