"""The LightningModule: owns the loss, the metrics, the optimizer and its schedule; the network is injected."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn

from ..config.objects import build_object
from ..data.batch_sizes import batches_per_epoch
from ..errors import ConfigError, located
from ..models.activation_checkpointing import checkpoint_blocks
from ..models.compilation import compile_net
from ..models.float8 import convert_float8
from ..parallel.sharding import clip_grad_norm_, clip_grad_value_
from ..runtime.checkpoint_forms import accept_state_by_name, by_name, parameter_names
from ..runtime.metrics import (
    check_train_loss,
    check_val_loss,
    correct_predictions,
    cross_entropy,
    perplexity,
    summed_loss,
)
from ..runtime.optimization import (
    OptimizerFactory,
    SchedulerFactory,
    current_lr,
    grouped_optimizer,
    respan,
    total_steps,
)
from ..runtime.precision import use_tensor_cores
from ..runtime.real_targets import RealTargets
from .lightning_private import (
    batches_that_stepped,
    continue_mid_epoch,
    count_steps_in_both_loops,
    count_this_runs_micro_batches,
    has_trainer,
    only_accumulates,
    set_batches_that_stepped,
)


class Classifier(L.LightningModule):
    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        no_decay_norms_and_biases: bool = True,
        scheduler: SchedulerFactory | None = None,
        compile: bool = False,
        tf32: bool = True,
        activation_checkpointing: str = "none",
        float8: str = "none",
    ) -> None:
        super().__init__()
        self.net = net
        self.optimizer_factory, self.no_decay_norms_and_biases = optimizer, no_decay_norms_and_biases
        self.scheduler_factory = scheduler  # configs/scheduler/, given by engine/training.py
        self.compile_net, self.tf32 = compile, tf32  # the top-level config keys, given by engine/training.py
        self.activation_checkpointing, self.float8 = activation_checkpointing, float8
        self.build_net: Callable[[], nn.Module] | None = None  # the net's build again (model_parallel's init=full)
        self._totals: dict[str, torch.Tensor] = {}  # per split: loss sum, correct, targets
        self._configured = False  # configure_model ran (in this process)
        self._value_targets: dict[str, bool] = {}  # per split: float targets (regression), not classes
        self._step_loss: torch.Tensor | float = 0.0  # of the optimizer step's accumulated batches so far
        self._step_lr = 0.0  # the learning rate of the last optimizer step
        self.real_targets = RealTargets()  # padding targets (-100) weighed as one device would (real_targets.py)

    def setup(self, stage: str) -> None:
        use_tensor_cores(self.tf32)  # in every process: spawned processes do not inherit the setting

    def configure_model(self) -> None:
        # Lightning calls this once the processes exist. Only model_parallel's tensor mode has a device
        # mesh; it shards the net by the plan the net declares (see strategies/model_parallel.py).
        # Once per module: trainer.test calls it again, on the net the fit made (a pipeline's stages: it was refused
        # as "a net without a Split" after the training, when activation checkpointing was on).
        if self._configured:
            return
        self._configured = True
        converted = convert_float8(self.net, self.float8)  # before sharding and wrapping (models/float8.py)
        if converted:
            rank_zero_info(f"float8={self.float8}: {len(converted)} Linear layers of the blocks compute in float8")
        if self.device_mesh is not None:
            self.trainer.strategy.parallelize(self.net, self.build_net)
        checkpoint_blocks(self.net, self.activation_checkpointing)  # in place, after sharding, before compiling
        if self.compile_net:  # in place, before ddp wraps it; compiled at its first call (compilation.py)
            compile_net(self.net, per_block=getattr(self.trainer.strategy, "compiles_per_block", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean loss of a batch (override it for a loss of your own: docs/your-model.md)."""
        return cross_entropy(logits, target)

    def training_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """`loss` weighted by the real targets of this part of the step's global batch: its padding (-100) then
        counts as on one device under every preset (runtime/real_targets.py). strategy=pipeline's stages use it."""
        return self.real_targets.weighted(self.loss)(logits, target)

    def on_train_start(self) -> None:
        self.real_targets.accumulate = self.trainer.accumulate_grad_batches  # (known once the trainer is)
        self.real_targets.reset()

    def on_train_batch_start(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.real_targets.count(batch[1])  # the whole batch of this process, before dp or OOM recovery split it

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.training_loss(self(x), y)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._step_lr = current_lr(optimizer)  # before the schedule moves it on, after this batch
        self.real_targets.scale_gradients(self.parameters())  # the accumulated batches' padding; before clipping

    def on_train_batch_end(self, outputs: dict[str, torch.Tensor], batch: object, batch_idx: int) -> None:
        # Logged here, from the loss the step returned, whatever ran the step: a step the OOM recovery split
        # into micro-batches logs the loss of its whole batch, and strategy=pipeline returns the last stage's
        # loss on every stage. A skipped step has no loss (Lightning then repeats the last value logged).
        # Lightning divides the loss of each of trainer.accumulate_grad_batches batches by their number, so
        # their sum is the loss of the optimizer step's global batch.
        if self.automatic_optimization and only_accumulates(self.trainer):
            if "loss" in outputs:
                self._step_loss = self._step_loss + outputs["loss"]
            return
        if "loss" not in outputs:
            self.real_targets.reset()
            return
        self._step_loss = self._step_loss + outputs["loss"]
        if (factor := self.real_targets.factor()) is not None:
            self._step_loss = self._step_loss * factor  # the accumulated batches' padding, as their gradient
        self.real_targets.reset()
        # sync_dist: the mean over all processes, i.e. the loss of the global batch (the tensor-parallel ranks
        # of a model_parallel replica hold the same loss). It is an all-reduce, so only on steps the loggers see.
        if writes_step_metrics(self.trainer):
            loss = self.trainer.strategy.reduce(self._step_loss, reduce_op="mean")  # (what sync_dist=True would log)
            check_train_loss(float(loss), self.trainer.global_step - 1)  # the same on every process: all stop here
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)  # (the bar shows it)
            self.log("train/lr", self._step_lr, on_step=True, on_epoch=False)
        self._step_loss = 0.0

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        return self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        return self._evaluate(batch, "test")

    def on_validation_batch_end(self, outputs: torch.Tensor | None, batch: Any, batch_idx: int, *args: Any) -> None:
        self._add_batch_totals(outputs, batch, "val")

    def on_test_batch_end(self, outputs: torch.Tensor | None, batch: Any, batch_idx: int, *args: Any) -> None:
        self._add_batch_totals(outputs, batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_split_totals("val")

    def on_test_start(self) -> None:
        # The test metrics at the training's last step, as after an uninterrupted fit. Where the fit trained nothing
        # in this process (a run continued from a checkpoint of its last step; ddp_spawn's first process, given the
        # trained state back), the loggers' counter was a step behind: a checkpoint holds it before its step counts.
        set_batches_that_stepped(self.trainer, max(batches_that_stepped(self.trainer), self.trainer.global_step))

    def on_test_epoch_end(self) -> None:
        self._log_split_totals("test")

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], split: str) -> torch.Tensor | None:
        x, y = batch
        logits = self(x)
        # Summed per target, divided once at the epoch's end: Lightning's batch-weighted mean counted a collate's
        # padding (IGNORED targets) as wrong tokens in one process, and its sync_dist mean truncates the summed
        # sample count to an integer mean over the ranks (101 samples on 2 ranks counted as 100). Targets the eval
        # sampler or a collate padded with (IGNORED) count nowhere.
        loss_sum, count = summed_loss(self.loss, logits, y)  # the loss of this module (of yours, if you change it)
        correct = correct_predictions(logits, y)
        totals = torch.stack([loss_sum.double(), correct.double(), count.double()])
        if has_trainer(self) and self.trainer.world_size > 1:
            self._value_targets[split] = y.is_floating_point()
            self._totals[split] = self._totals.get(split, 0) + totals
            return None
        return totals[None]  # one process: dp's replicas give a row each (gathered), added up in the root module

    def _log_split_totals(self, split: str) -> None:
        """Loss, accuracy and perplexity (exp of the loss) over every sample of the split, evaluated once each (the
        eval sampler repeats none); processes that share a batch (tensor or pipeline parallel) count it in the sum
        and in the count alike."""
        classes = not self._value_targets.pop(split, False)  # values (regression): no accuracy, no perplexity
        if split not in self._totals:
            return
        totals = self._totals.pop(split)
        if self.trainer.world_size > 1:  # (one process: as they are; dp's reduce is a mean)
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        loss_sum, correct, count = totals.tolist()
        # Global values already, the same on every process: sync_dist's max of equal values changes nothing (a mean
        # over 3 could round), and Lightning no longer recommends syncing them.
        synced = {"sync_dist": True, "reduce_fx": "max"}
        self.log(f"{split}/loss", loss_sum / count, **synced)
        if classes:
            self.log(f"{split}/acc", correct / count, **synced)
            self.log(f"{split}/perplexity", perplexity(loss_sum / count), **synced)
        if split == "val" and not self.trainer.sanity_checking:
            check_val_loss(loss_sum / count, self.current_epoch)

    def _add_batch_totals(
        self, totals: torch.Tensor | None, batch: tuple[torch.Tensor, torch.Tensor], split: str
    ) -> None:
        """One process: add up the batch's loss sum, correct and targets, here in the root module (under dp the step
        ran in replicas, each giving a row). (Several processes: _evaluate adds them up itself.)"""
        if totals is None:
            return
        self._value_targets[split] = batch[1].is_floating_point()
        self._totals[split] = self._totals.get(split, 0) + totals.reshape(-1, 3).sum(dim=0)

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm=None
    ) -> None:
        # Tensor-parallel shards (DTensors) next to plain parameters: torch's clipping refuses the mix.
        if gradient_clip_val and self.device_mesh is not None:
            clip = clip_grad_value_ if gradient_clip_algorithm == "value" else clip_grad_norm_
            clip(self.parameters(), gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> torch.optim.Optimizer | dict[str, Any]:
        optimizer = grouped_optimizer(self.optimizer_factory, self.parameters(), self.no_decay_norms_and_biases)
        accept_state_by_name(optimizer, self._parameter_names)  # a checkpoint of any preset (checkpoint_forms.py)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer, total_steps=self._total_steps())
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _parameter_names(self) -> dict[torch.Tensor, list[str]]:
        return parameter_names(self.named_parameters(remove_duplicate=False))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The whole-model presets' optimizer state keyed by parameter name: any preset reads it (checkpoint_forms.py).
        # The presets whose processes write parts (a checkpoint_writer) keyed theirs so already.
        if "optimizer_states" in checkpoint and getattr(self.trainer.strategy, "checkpoint_writer", None) is None:
            names, optimizers = self._parameter_names(), self.trainer.optimizers
            states = zip(checkpoint["optimizer_states"], optimizers, strict=True)
            checkpoint["optimizer_states"] = [by_name(state, optimizer, names) for state, optimizer in states]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Before Lightning restores its loops from it: a checkpoint of strategy=pipeline continues under the other
        # presets (and theirs under pipeline) with its optimizer steps counted.
        count_steps_in_both_loops(checkpoint)
        continue_mid_epoch(checkpoint)  # one an earlier version saved when trainer.max_steps stopped it mid-epoch
        # ckpt_path= with another batch or accumulation (a batch the batch-size finder found is kept: not here)
        found = any("global_batch_size" in state for state in checkpoint.get("callbacks", {}).values())
        if has_trainer(self) and getattr(self.trainer, "datamodule", None) is not None and not found:
            micro_batch = self.trainer.datamodule.batch_size // self.trainer.accumulate_grad_batches
            count_this_runs_micro_batches(checkpoint, micro_batch)

    def on_fit_start(self) -> None:
        # After the callbacks' on_fit_start: the batch-size finder may have changed the steps per epoch, and scaled
        # the learning rate, since configure_optimizers built the schedule. It spans the training as it will run.
        # (A resumed run then loads the schedule its checkpoint saved.)
        for config in self.trainer.lr_scheduler_configs:
            respan(config.scheduler, self.scheduler_factory, self._total_steps())

    def _total_steps(self) -> int:
        """Optimizer steps of the whole training, which the schedule spans. Not the Trainer's
        estimated_stepping_batches: it loads the training data before a resumed run restores the loader's
        position, which is then never restored (Lightning 2.6, FitLoop.setup_data)."""
        trainer = self.trainer
        batches = batches_per_epoch(len(trainer.datamodule.train_dataloader()), trainer.limit_train_batches)
        steps_per_epoch = batches // trainer.accumulate_grad_batches
        return total_steps(trainer.max_steps, trainer.max_epochs, steps_per_epoch)


def writes_step_metrics(trainer: L.Trainer) -> bool:
    """Whether Lightning sends this training batch's `on_step` metrics to the loggers; ask in
    on_train_batch_end. The same test as Lightning 2.5-2.6 (`_LoggerConnector.update_train_step_metrics`),
    which reads loop counters that have no public name; the cheapest part first, as most steps are not logged."""
    # Batches that took an optimizer step, this one included (the counter moves after this hook): every
    # log_every_n_steps-th is logged, and the last one when training is told to stop.
    every, step = trainer.log_every_n_steps, batches_that_stepped(trainer) + 1
    if not (trainer.fast_dev_run or (every and (step % every == 0 or trainer.should_stop))):
        return False
    # A batch that only accumulates gradients is never logged.
    return not (trainer.lightning_module.automatic_optimization and only_accumulates(trainer))


def own_module(target: str) -> type[Classifier]:
    """The class `+model._target_` names: a subclass of Classifier (refused in one line otherwise)."""
    module = located("model._target_", target, "a subclass of engine.module.Classifier, e.g. my_module.MyClassifier")
    if not (isinstance(module, type) and issubclass(module, Classifier)):
        raise ConfigError(f"model._target_={target} is not a subclass of engine.module.Classifier")
    return module


def build_module(model: DictConfig, **settings: Any) -> Classifier:
    """The LightningModule for a model config (model.net, model.optimizer, model.no_decay_norms_and_biases: the keys
    both engines read) and the run's settings. `+model._target_=my_module.MyClassifier` trains another subclass of
    Classifier, given the config's other keys too (`+model.my_option=...`); a run saved by an earlier version names
    engine.module.Classifier there."""
    module = own_module(model._target_) if "_target_" in model else Classifier
    own = {"_target_", "net", "optimizer", "no_decay_norms_and_biases"}
    extra = {key: OmegaConf.to_object(value) if isinstance(value, DictConfig | ListConfig) else value
             for key, value in model.items() if key not in own}  # fmt: skip
    net, optimizer = build_object(model.net), build_object(model.optimizer)
    try:
        classifier = module(
            net=net,
            optimizer=optimizer,
            no_decay_norms_and_biases=model.get("no_decay_norms_and_biases", True),
            **extra,
            **settings,
        )
    except TypeError as err:  # e.g. a +model.KEY its __init__ does not take
        key = str(err).partition("unexpected keyword argument ")[2].strip("'\"")
        if key not in extra:
            raise ConfigError(f"model._target_={model.get('_target_', 'Classifier')}: {err}") from None
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        parameters = inspect.signature(module).parameters.values()
        taken = [p.name for p in parameters if p.kind in named and p.name not in (*own, *settings)]
        kinds = f"its own: {', '.join(taken)}" if taken else "none of its own"
        raise ConfigError(
            f"model.{key}: {module.__name__} takes model.net, model.optimizer, model.no_decay_norms_and_biases and "
            f"{kinds} (another loss or setting: a subclass of Classifier, +model._target_=..., docs/your-model.md)"
        ) from None
    classifier.build_net = functools.partial(build_object, model.net)  # picklable (ddp_spawn), unlike a lambda
    return classifier
