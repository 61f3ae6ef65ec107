"""How each preset lays a run out over processes and devices, for the Accelerate training (engine/training.py).

`Strategy` is strategy=single and the base of the others. A preset answers, among others, these: how its
processes start (`launch`), whether a layout can work (`check_layout`, before training), how many
data-parallel replicas there are (`data_parallel`), how the net and optimizer are wrapped (`prepare`) and
how one batch is trained (`train_step`). configs/strategy/<name>.yaml points at the class.
"""

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from omegaconf import DictConfig
from torch import nn

from ...errors import ConfigError
from ...parallel.launcher import started_alone
from ...parallel.layout import Layout
from ...runtime.checkpoint_forms import keep_state_by_name, parameter_names
from ...runtime.hardware import check_device_settings
from ...runtime.resuming import check_same_mesh
from ..checkpoints import has_no_weights, no_net, saved_by_layers

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")  # gpu and cuda alike, as in Lightning


def check_devices(accelerator: str, devices: Any, preset: str, num_nodes: int = 1) -> None:
    """trainer.accelerator and trainer.devices as Lightning's Trainer checks them, in one line each: accelerate
    itself would train on the CPU whatever the words (trainer.accelerator=gpuu, or gpu on a machine without one)."""
    if accelerator not in ACCELERATORS:
        raise ConfigError(f"trainer.accelerator={accelerator} is unknown; valid: {', '.join(ACCELERATORS)}")
    check_device_settings(accelerator, devices)
    if preset == "single" and type(devices) is int and devices > 1:
        raise ConfigError(
            f"strategy=single runs one device but trainer.devices={devices}; for {devices} processes: strategy=ddp "
            f"trainer.devices={devices} (this command starts them under torchrun; or `accelerate launch --config_file "
            f"launch/multi_process.yaml --num_processes {devices} -m {{ cookiecutter.package_name }}.train "
            "strategy=ddp`)"
        )
    if preset == "single" and num_nodes != 1:  # (as Lightning's words: it trained one process)
        each = max(torch.cuda.device_count(), 1) if devices in ("auto", -1) else devices
        raise ConfigError(
            f"strategy=single runs one device but trainer.devices={each} x trainer.num_nodes={num_nodes} asks for "
            f"{each * num_nodes}; use strategy=ddp for several"
        )


def more_processes(preset: str) -> str:
    """How to start more than the one process a preset of several found, said to what started it."""
    return started_alone() or (
        "give trainer.devices=N (this command starts them under torchrun), or launch it with `accelerate launch "
        f"--config_file launch/multi_process.yaml -m {{ cookiecutter.package_name }}.train strategy={preset}` (or "
        "torchrun)"
    )


class Strategy:
    """single: one process, one device (a GPU, or the CPU)."""

    name = "single"
    supports_batch_size_search = True  # False where the forward itself is a collective
    sync_batchnorm = False  # whether the net's BatchNorm layers are synchronised over the processes (ddp)
    compiles_per_block = False  # compile=true: the whole net, or (presets that split it) each block
    writes_checkpoint_parts = False  # every process writes its own part of a checkpoint (sharded_state)

    def __init__(self, timeout: timedelta = timedelta(minutes=10)) -> None:
        self.timeout = timeout

    def launch(self, run: Callable[[], None], devices: int) -> None:
        """Start the training processes; this preset runs in the process it is given (or launched) in."""
        run()

    def processes(self, launched: int, devices: int) -> int:
        """How many processes the run will have: the launcher's (accelerate launch, torchrun) by default."""
        return launched

    def check_resume(self, checkpoint: Path | None, processes: int, given: bool = False) -> None:
        """Refuse, before training, a checkpoint this layout cannot continue: one of model_parallel's with tensor
        parallelism (runtime/resuming.check_same_mesh), or of its mode=layers. Any other preset's it continues.
        `given`: named by ckpt_path= (the refusal's way out is another checkpoint, not resume=false)."""
        if checkpoint is not None:
            parts = checkpoint / "sharded"  # a whole-model checkpoint has none: no tensor parallelism
            check_same_mesh(parts if parts.is_dir() else checkpoint, *self.mesh(processes), self.name, given)
            if saved_by_layers(checkpoint):
                raise ConfigError(
                    f"{checkpoint} was saved by strategy=model_parallel strategy.mode=layers, whose checkpoint keeps "
                    "the net where the other presets keep their schedule: it resumes under that preset only"
                )
            if has_no_weights(checkpoint):
                raise no_net(checkpoint)

    def device_layout(self, processes: int) -> Layout:
        """The run's replicas x shards x tensor_parallel x stages (parallel/layout.py): data parallel over every
        process (single, ddp) unless the preset says otherwise."""
        return Layout(replicas=processes)

    def mesh(self, processes: int) -> tuple[int, int]:
        """(data-parallel, tensor-parallel) sizes over `processes`: no tensor parallelism but model_parallel's and
        pipeline's."""
        return self.data_parallel(0, processes)[0], 1

    def check_layout(self, processes: int, net: nn.Module, cfg: DictConfig) -> None:
        """Refuse, before anything is written, a layout this preset cannot run."""
        if processes > 1:
            raise ConfigError(f"strategy=single runs one process but {processes} were launched; use strategy=ddp")

    def accelerator_kwargs(self) -> dict[str, Any]:
        # A hung collective fails after the timeout instead of blocking forever.
        return {"kwargs_handlers": [InitProcessGroupKwargs(timeout=self.timeout)]}

    def data_parallel(self, process_index: int, processes: int) -> tuple[int, int]:
        """(replicas, this process's replica): each replica reads its own slice of every global batch."""
        return processes, process_index

    def build_net(self, build: Callable[[], nn.Module]) -> nn.Module:
        """Build the net (model_parallel builds it on the meta device and allocates only its shards)."""
        return build()

    def prepare(
        self, accelerator: Accelerator, net: nn.Module, optimizer: Callable[..., torch.optim.Optimizer]
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Move (and, under ddp, wrap) the net; the optimizer is made for the parameters that are trained. Its
        state is saved keyed by parameter name, which the presets that split the net read too (checkpoint_forms.py)."""
        built = optimizer(net.parameters())
        keep_state_by_name(built, lambda: parameter_names(net.named_parameters(remove_duplicate=False)))
        return accelerator.prepare(net, built)

    def train_step(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_fn: LossFn,
        logged: bool = True,
    ) -> torch.Tensor:
        """Forward and backward of one batch; returns the (detached) loss. The loop steps the optimizer. `logged`:
        whether the loop logs this step (what a preset measures per step, it measures then).
        Under autocast here, not only in the net's prepared forward: model_parallel's and dp's nets are not
        prepared (dp's replicas enter it again in their threads, see dp.AutocastReplica)."""
        with accelerator.autocast():
            loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        return loss.detach()

    def devices_in_use(self) -> list[torch.device]:
        """Devices this process uses besides accelerator.device (dp's replicas, model_parallel's layer groups)."""
        return []

    def step_metrics(self) -> dict[str, float]:
        """Extra figures logged with train/loss."""
        return {}

    def mean_of_step_metrics(self, accelerator: Accelerator, means: torch.Tensor) -> torch.Tensor:
        """Means over the steps since the last log (train/loss_mean), averaged over the processes."""
        return accelerator.reduce(means, "mean")

    def checkpoint_objects(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[Any]:
        """What save_state must also save, beyond the prepared model and optimizer (which it saves itself)."""
        return []

    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Any | None:
        """State that every process writes and reads its own part of (`save(folder)`, `load(folder)`, collective),
        next to save_state's files: a sharded net is never gathered on one process."""
        return None
