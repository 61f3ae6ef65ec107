"""strategy=pipeline: pipeline parallelism as a Lightning strategy, one process per stage (or several, looped).

Each process keeps only its stages of the net (cut between the blocks of its Split, parallel/split.py) and trains them
with a torch.distributed.pipelining schedule, which cuts the batch into micro-batches so the stages overlap.
The schedule runs forward and backward in one call, so the strategy owns the training step (manual
optimization); validation, test, logging and checkpoints go through the usual Lightning paths. Checkpoints are
folders that each stage writes its part of (torch.distributed.checkpoint), as model_parallel's.
Every stage of a pipeline reads the same batch; `strategy.data_parallel_size=D` runs D pipelines side by side, each
on its slice of the global batch (pipelining.py).
"""

import inspect
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed.checkpoint as dcp
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

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
from ...runtime.async_saves import CheckpointWriter
from ...runtime.checkpoint_forms import (
    STAGES,
    drop_unsaved_state,
    form_of,
    load_optimizer_state,
    saved_entries,
    stage_state,
)
from ...runtime.resuming import write_mesh
from ..module import Classifier, writes_step_metrics
from .sharded_checkpoints import META, check_named, read_whole, write_parts


class PipelineStrategy(DDPStrategy):
    """Pipeline-parallel training over all processes: `data_parallel_size` pipelines of world_size /
    (data_parallel_size x tensor_parallel_size) stages, each stage's blocks sharded over `tensor_parallel_size`
    processes (pipelining.PipelineLayout: one DeviceMesh).

    Launching, the process group (and its timeout) and devices come from DDPStrategy; Lightning wraps nothing
    in DistributedDataParallel (pipelining.Pipeline wraps each stage when there are several pipelines).
    """

    compiles_per_block = True  # compile=true: each block, in place, before the net is cut (compilation.py)

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
        per_process = check_stages_per_process(schedule, stages_per_process)  # refuses an unknown schedule
        # DDPStrategy passes what it does not know on to DistributedDataParallel, which no pipeline builds
        check_pipeline_settings(set(kwargs) - set(inspect.signature(DDPStrategy.__init__).parameters))
        super().__init__(**kwargs)
        self.checkpoint_writer = CheckpointWriter()  # checkpoint.async=true: in the background (training.prepare)
        self.microbatches = microbatches
        self.schedule, self.per_process = schedule, per_process
        self.split_points = list(split_points) if split_points is not None else None
        self.replicas, self.tensor_parallel_size = data_parallel_size, tensor_parallel_size
        self._pipeline: Pipeline | None = None

    @property
    def data_parallel_size(self) -> int:  # read by the data module: the pipelines split the global batch
        return self.replicas

    @property
    def data_parallel_rank(self) -> int:  # every stage of a pipeline loads the same slice: its pipeline's
        return self.layout.pipeline_of(self.global_rank)

    @property
    def layout(self) -> PipelineLayout:
        return PipelineLayout.over(
            self.world_size, self.replicas, self.schedule, self.per_process, self.tensor_parallel_size
        )

    @property
    def stages(self) -> int:
        return self.layout.stages

    def device_layout(self) -> Layout:
        return self.layout.as_layout()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # a checkpoint is read in place: once this process holds its stage and optimizer

    def check_layout(self, trainer: L.Trainer, module: L.LightningModule, global_batch_size: int) -> None:
        """Refuse, before any process starts, a pipeline that cannot run."""
        check_split_backward(self.schedule, module.compile_net, getattr(module, "activation_checkpointing", "none"))
        check_pipeline(
            self.world_size,
            self.microbatches,
            global_batch_size,
            module.net,
            self.split_points,
            self.replicas,
            self.schedule,
            self.per_process,
            self.tensor_parallel_size,
        )
        check_pipeline_training(trainer.accumulate_grad_batches, trainer.gradient_clip_val)
        if type(module).training_step is not Classifier.training_step:  # (what it logged went missing in silence)
            raise ConfigError(
                f"strategy=pipeline runs each step itself, not {type(module).__name__}.training_step (of "
                "+model._target_): log a metric of yours from a callback (docs/your-model.md), or use another preset"
            )
        if trainer.precision == "16-mixed":  # one gradient scaler per stage would skip steps out of step
            raise ConfigError("strategy=pipeline supports trainer.precision=32-true or bf16-mixed, not 16-mixed")

    def setup(self, trainer: L.Trainer) -> None:
        self.accelerator.setup(trainer)
        module = self.lightning_module
        if not isinstance(module.net, PipelinedNet):  # setup runs again for trainer.test
            module.net = PipelinedNet.of(
                module.net,
                self.global_rank,
                self.world_size,
                self.split_points,
                self.replicas,
                self.schedule,
                self.per_process,
                self.tensor_parallel_size,
                self.root_device.type,
            )
        module.automatic_optimization = False  # training_step below runs forward, backward and the step
        self.precision_plugin.convert_module(module)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._pipeline = Pipeline(
                module.net, self.root_device, self.microbatches, self.schedule, module.training_loss
            )
            self._log_layout(trainer)
        self.setup_precision_plugin()

    def _log_layout(self, trainer: L.Trainer) -> None:
        """Record the split (parameters per stage: is it balanced?) and the theoretical bubble."""
        summary = self._pipeline.summary()
        for logger in trainer.loggers:
            logger.log_hyperparams({"pipeline": summary})
        if self.is_global_zero:
            print(f"pipeline: {summary} (in wandb's config as pipeline.*)")

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

    def mean_of_step_metrics(self, means: torch.Tensor) -> torch.Tensor:
        """The step metrics' means over the steps since the last log (callbacks/item_logger.py): the last stages',
        averaged over the pipelines. The other stages have no loss on the steps that are not logged (NaN)."""
        return self._pipeline.mean_over_pipelines(means)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """This stage's part of the model, under the single-device names (net.blocks.2..., not net.stage...)."""
        return {single_device_name(key): value for key, value in self.lightning_module.state_dict().items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return get_optimizer_state_dict(self.lightning_module, optimizer, options=STAGE_OPTIMIZER_STATE)

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        own = {single_device_name(key): key for key in self.lightning_module.state_dict()}
        state = {own[key]: value for key, value in checkpoint["state_dict"].items()}
        self.lightning_module.load_state_dict(state, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: dict[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"], strict=True):
            # A stage's part is flattened (STAGE_OPTIMIZER_STATE); another preset's checkpoint nested (load_checkpoint)
            options = StateDictOptions() if "state" in state else STAGE_OPTIMIZER_STATE
            load_optimizer_state(self.lightning_module, optimizer, state, options)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """A folder, as model_parallel's: every stage writes its own parameters and optimizer state into it with
        torch.distributed.checkpoint, and rank 0 the rest (meta.pt: loop counters, callbacks, random states).
        No process ever holds the whole model; load_trained puts it together on one device."""
        write_parts(checkpoint, Path(filepath), self.checkpoint_writer, self.is_global_zero)
        write_mesh(Path(filepath), self.replicas, self.tensor_parallel_size, "pipeline")  # resumed with the same

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """This stage's part of a checkpoint folder, read in place (the entries of its own parameters only), and the
        rest from meta.pt. The names do not depend on the split: the pipeline may resume with other stages."""
        path = Path(checkpoint_path)
        if form_of(path) != STAGES:  # another preset's: read whole, this stage's entries kept
            return self._stage_of(read_whole(path, weights_only))
        checkpoint = torch.load(path / META, map_location="cpu", weights_only=weights_only)
        stage = {"state_dict": self.lightning_module_state_dict()}
        saved = saved_entries(path)
        with_optimizers = any(key.startswith("optimizer_") for key in saved)  # not in weights-only checkpoints
        if with_optimizers and self.lightning_module.trainer.state.fn == TrainerFn.FITTING:
            stage.update({f"optimizer_{i}": self.optimizer_state(opt) for i, opt in enumerate(self.optimizers)})
        for key in set(stage) - {"state_dict"}:  # not the state of a parameter that never had a gradient (none saved)
            drop_unsaved_state(stage[key], saved, key)
        dcp.load(stage, checkpoint_id=path)
        checkpoint["state_dict"] = stage.pop("state_dict")
        if stage:
            checkpoint["optimizer_states"] = [stage[f"optimizer_{i}"] for i in range(len(self.optimizers))]
        return checkpoint

    def _stage_of(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """This stage's entries of a checkpoint read whole (single-device names), its optimizer state under the
        stage's names."""
        whole, module = checkpoint["state_dict"], self.lightning_module
        checkpoint["state_dict"] = {name: whole[name] for name in map(single_device_name, module.state_dict())}
        names = {single_device_name(name): name for name, _ in module.named_parameters()}
        tied = {f"net.{name}": [f"net.{other}" for other in others] for name, others in module.net.aliases.items()}
        if "optimizer_states" in checkpoint and module.trainer.state.fn == TrainerFn.FITTING:
            check_named(checkpoint["optimizer_states"])
            checkpoint["optimizer_states"] = [
                stage_state(state, names, tied) for state in checkpoint["optimizer_states"]
            ]
        else:  # a weights-only checkpoint, or weights only needed (test, validate)
            checkpoint.pop("optimizer_states", None)
        return checkpoint
