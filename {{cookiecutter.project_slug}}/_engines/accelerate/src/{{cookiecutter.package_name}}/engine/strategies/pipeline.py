"""pipeline: one process per pipeline stage (or several, looped), trained with the schedule in pipelining.py
(shared with the Lightning engine). Each process keeps only its stages; every stage of a pipeline reads the same
batch, which the schedule cuts into micro-batches so the stages overlap. `strategy.data_parallel_size=D`: D pipelines
side by side, each on its slice of the global batch."""

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from omegaconf import DictConfig
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions

from ...errors import ConfigError
from ...parallel.layout import Layout
from ...parallel.pipelining import (
    STAGE_OPTIMIZER_STATE,
    Pipeline,
    PipelinedNet,
    PipelineLayout,
    check_pipeline,
    check_pipeline_settings,
    check_pipeline_training,
    check_split_backward,
    check_stages_per_process,
    single_device_name,
)
from ...runtime.checkpoint_forms import STAGES, form_of, stage_state
from ..checkpoints import read_whole
from . import LossFn, Strategy, more_processes
from .model_parallel import ShardedState


class PipelineParallel(Strategy):
    name = "pipeline"
    supports_batch_size_search = False
    compiles_per_block = True
    writes_checkpoint_parts = True

    def __init__(
        self,
        microbatches: int = 4,
        schedule: str = "1f1b",
        stages_per_process: int | None = None,
        split_points: list[int] | None = None,
        data_parallel_size: int = 1,
        tensor_parallel_size: int = 1,
        **kwargs: Any,
    ) -> None:
        check_pipeline_settings(set(kwargs) - set(inspect.signature(Strategy.__init__).parameters))
        super().__init__(**kwargs)
        self.microbatches, self.schedule = microbatches, schedule
        self.per_process = check_stages_per_process(schedule, stages_per_process)  # refuses an unknown schedule
        self.split_points = list(split_points) if split_points is not None else None
        # The stages are the processes' share of the pipelines, known in check_layout; the pipelines are given.
        self.layout = PipelineLayout(1, data_parallel_size, self.per_process, tensor_parallel=tensor_parallel_size)
        self.pipeline: Pipeline | None = None
        self.idle: list[float] = []

    def check_layout(self, processes: int, net: nn.Module, cfg: DictConfig) -> None:
        if cfg.trainer.precision == "16-mixed":  # one gradient scaler per stage would skip steps out of step
            raise ConfigError("strategy=pipeline supports trainer.precision=32-true or bf16-mixed, not 16-mixed")
        replicas, schedule, per_process = self.layout.replicas, self.schedule, self.per_process
        tensor_parallel = self.layout.tensor_parallel
        check_split_backward(schedule, cfg.compile, cfg.activation_checkpointing)
        batch, split_points = cfg.data.batch_size, self.split_points
        check_pipeline(
            processes,
            self.microbatches,
            batch,
            net,
            split_points,
            replicas,
            schedule,
            per_process,
            tensor_parallel,
            launch=more_processes(self.name),
        )
        self.layout = PipelineLayout.over(processes, replicas, schedule, per_process, tensor_parallel)
        check_pipeline_training(cfg.trainer.accumulate_grad_batches, cfg.trainer.gradient_clip_val)

    def data_parallel(self, process_index: int, processes: int) -> tuple[int, int]:
        # Every stage of a pipeline reads its pipeline's slice of the batch.
        layout = self.layout_over(processes)
        return layout.replicas, layout.pipeline_of(process_index)

    def layout_over(self, processes: int) -> PipelineLayout:
        layout = self.layout
        return PipelineLayout.over(processes, layout.replicas, self.schedule, self.per_process, layout.tensor_parallel)

    def mesh(self, processes: int) -> tuple[int, int]:
        return self.layout.replicas, self.layout.tensor_parallel

    def prepare(
        self, accelerator: Accelerator, net: nn.Module, optimizer: Callable[..., torch.optim.Optimizer]
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        layout = self.layout_over(accelerator.num_processes)
        stage = PipelinedNet.of(
            net,
            accelerator.process_index,
            accelerator.num_processes,
            self.split_points,
            layout.replicas,
            self.schedule,
            self.per_process,
            layout.tensor_parallel,
            accelerator.device.type,
        )
        stage = stage.to(accelerator.device)
        return stage, optimizer(stage.parameters())

    def train_step(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_fn: LossFn,
        logged: bool = True,
    ) -> torch.Tensor:
        """Each stage's part of the step. Only a logged step brings the loss to every stage, with the idle shares:
        the loop reads the loss on those steps alone."""
        if self.pipeline is None:
            self.pipeline = Pipeline(model, accelerator.device, self.microbatches, self.schedule, loss_fn)
            self._log_layout(accelerator)
        with accelerator.autocast():
            loss, idle = self.pipeline.train_step(x, y, measure=logged)
        self.idle = idle or []
        return loss

    def _log_layout(self, accelerator: Accelerator) -> None:
        """Record the split (parameters per stage: is it balanced?) and the theoretical bubble."""
        summary = self.pipeline.summary()
        if accelerator.is_main_process:
            if accelerator.trackers:  # (logger=none: no wandb run)
                tracker = accelerator.get_tracker("wandb", unwrap=True)  # (a resumed run may have had other stages)
                tracker.config.update({"pipeline": summary}, allow_val_change=True)
            print(f"pipeline: {summary} (in wandb's config as pipeline.*)")

    def step_metrics(self) -> dict[str, float]:
        return {f"pipeline/idle_fraction/stage{rank}": idle for rank, idle in enumerate(self.idle)}

    def mean_of_step_metrics(self, accelerator: Accelerator, means: torch.Tensor) -> torch.Tensor:
        """The last stages' means, averaged over the pipelines: the other stages have no loss on the steps that are
        not logged (NaN)."""
        return self.pipeline.mean_over_pipelines(means)

    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> "StageState":
        return StageState(model, optimizer, self.name, (self.layout.replicas, self.layout.tensor_parallel))

    def device_layout(self, processes: int) -> Layout:
        return self.layout.as_layout()


class StageState(ShardedState):
    """This stage's net and optimizer, in the checkpoint's `sharded/` folder as model_parallel's shards are: every
    stage writes its own part (torch.distributed.checkpoint), no process gathers the whole net. The net is saved
    under the single-device names, which load_trained reads on one device; the optimizer state is keyed by
    parameter name (STAGE_OPTIMIZER_STATE). Neither depends on the split, so a run may resume with other stages."""

    options = STAGE_OPTIMIZER_STATE
    form = STAGES

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        state["model"] = {single_device_name(name): value for name, value in state["model"].items()}
        return state

    def load(self, checkpoint: Path) -> None:
        folder = checkpoint / "sharded"
        if not folder.is_dir() or form_of(folder) != self.form:  # another preset's checkpoint
            self._load_whole(*read_whole(checkpoint))
            return
        state = self._read(folder)  # this stage's entries only, in place
        own = {single_device_name(name): name for name in self.model.state_dict()}
        model = {own[name]: value for name, value in state["model"].items()}
        self._set(model, state["optimizer"], self.options)

    def _load_whole(self, model: dict[str, Any], optimizer: dict[str, Any]) -> None:
        """This stage's entries of one device's net and optimizer state (read_whole), under the stage's names. A
        whole-model file holds a tied parameter under one of its names (the embedding's, not the head's)."""
        aliases = self.model.aliases
        own = {name: single_device_name(name) for name in self.model.state_dict()}
        saved = {name: next(n for n in [whole, *aliases.get(whole, [])] if n in model) for name, whole in own.items()}
        stage = {name: model[saved_as] for name, saved_as in saved.items()}
        names = {single_device_name(name): name for name, _ in self.model.named_parameters()}
        optimizer = stage_state(optimizer, names, aliases)
        self._set(stage, optimizer, StateDictOptions())
