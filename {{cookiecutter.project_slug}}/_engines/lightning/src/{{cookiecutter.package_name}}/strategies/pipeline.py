"""strategy=pipeline: pipeline parallelism as a Lightning strategy, one process per stage.

Each process keeps only its stage of the net (cut between the blocks of its Split, model_split.py) and trains it with a
torch.distributed.pipelining schedule, which cuts the batch into micro-batches so the stages overlap.
The schedule runs forward and backward in one call, so the strategy owns the training step (manual
optimization); validation, test, logging and checkpoints go through the usual Lightning paths.
Every stage reads the same batch: the pipeline is one data-parallel replica (pp x dp is not supported).
"""

import copy
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from ..config import ConfigError
from ..module import writes_step_metrics
from ..pipelining import (
    SCHEDULES,
    Pipeline,
    PipelinedNet,
    bubble_fraction,
    check_pipeline,
    gather_whole_state,
    single_device_name,
    without_parameters,
)


class PipelineStrategy(DDPStrategy):
    """Pipeline-parallel training over all processes (stage i = global rank i).

    Launching, the process group (and its timeout) and devices come from DDPStrategy; nothing is wrapped
    in DistributedDataParallel because no two processes hold the same parameters.
    """

    data_parallel_size = 1  # read by the data module: every stage loads the whole batch
    data_parallel_rank = 0
    compiles_per_block = True  # compile=true: each block, in place, before the net is cut (compilation.py)

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
        self._pipeline: Pipeline | None = None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # checkpoints hold the whole model: load once this process knows its stage

    def check_layout(self, trainer: L.Trainer, module: L.LightningModule, global_batch_size: int) -> None:
        """Refuse, before any process starts, a pipeline that cannot run."""
        check_pipeline(self.world_size, self.microbatches, global_batch_size, module.net, self.split_points)
        if trainer.accumulate_grad_batches != 1 or trainer.gradient_clip_val:
            raise ConfigError(
                "strategy=pipeline does not support trainer.accumulate_grad_batches or trainer.gradient_clip_val; "
                "raise strategy.microbatches to save memory instead"
            )
        if trainer.precision == "16-mixed":  # one gradient scaler per stage would skip steps out of step
            raise ConfigError("strategy=pipeline supports trainer.precision=32-true or bf16-mixed, not 16-mixed")

    def setup(self, trainer: L.Trainer) -> None:
        self.accelerator.setup(trainer)
        module = self.lightning_module
        if not isinstance(module.net, PipelinedNet):  # setup runs again for trainer.test
            module.net = PipelinedNet.of(module.net, self.global_rank, self.world_size, self.split_points)
        module.automatic_optimization = False  # training_step below runs forward, backward and the step
        self.precision_plugin.convert_module(module)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._pipeline = Pipeline(module.net, self.root_device, self.microbatches, self.schedule, module.loss)
            self._log_layout(trainer)
        self.setup_precision_plugin()

    def _log_layout(self, trainer: L.Trainer) -> None:
        """Record the split (parameters per stage: is it balanced?) and the theoretical bubble."""
        layout = {
            "stages": self.world_size,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "parameters_per_stage": self._pipeline.parameter_counts(),
            "bubble_fraction": round(bubble_fraction(self.world_size, self.microbatches), 4),
        }
        for logger in trainer.loggers:
            logger.log_hyperparams({"pipeline": layout})
        if self.is_global_zero:
            print(f"pipeline: {layout} (bubble = (stages - 1) / (microbatches + stages - 1))")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        module = self.lightning_module
        optimizer = module.optimizers()
        optimizer.zero_grad()
        # Only a step the loggers see brings the loss to every stage, with the idle shares (the module logs the
        # loss on those steps alone): the other steps neither wait for the GPU nor communicate beyond the schedule.
        measure = writes_step_metrics(module.trainer)
        with self.precision_plugin.train_step_context():  # autocast around every stage's forward
            loss, idle = self._pipeline.train_step(*batch, measure=measure)
        optimizer.step()
        if (scheduler := module.lr_schedulers()) is not None:  # manual optimization: Lightning leaves it to us
            scheduler.step()
        # Every process has the same values; rank 0's logger sends them once, at this global step.
        for rank, fraction in enumerate(idle or []):
            module.log(f"pipeline/idle_fraction/stage{rank}", fraction, on_step=True, on_epoch=False)
        return loss

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
        # preset (single too) can load, for evaluation or to resume training. A tied parameter's optimizer state
        # is counted once, as one device's optimizer holds it once (its copies are equal).
        optimizer_states = checkpoint.get("optimizer_states")
        if optimizer_states is not None:
            copies = self.lightning_module.net.tied_copies()
            optimizer_states = [
                without_parameters(state, optimizer, copies)
                for state, optimizer in zip(optimizer_states, self.optimizers, strict=True)
            ]
        state, optimizer_states = gather_whole_state(
            checkpoint["state_dict"], optimizer_states, self.global_rank, self.world_size
        )
        if self.is_global_zero:
            whole = dict(checkpoint, state_dict=state)
            if optimizer_states is not None:  # absent from weights-only checkpoints
                whole["optimizer_states"] = optimizer_states
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


def with_automatic_step_count(loops: dict[str, Any]) -> dict[str, Any]:
    """Loop state whose optimizer step count is also where automatic optimization (every other preset) reads
    it, so that a single-device run resuming the consolidated checkpoint continues at the same global step."""
    loops = copy.deepcopy(loops)
    fit_loop = loops["fit_loop"]
    steps = fit_loop["epoch_loop.manual_optimization.optim_step_progress"]
    fit_loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"] = copy.deepcopy(steps)
    return loops
