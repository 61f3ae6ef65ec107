"""model_parallel: split the model itself over devices, for models too big for one device's memory.

Accelerate's own tensor parallelism (ParallelismConfig) needs a transformers model with a `tp_plan`, and its
FSDP plugin needs GPUs. This preset applies the net's `Split` (parallel/split.py) with torch.distributed instead
(sharding.py, shared with the Lightning engine), which also runs on CPU/gloo; Accelerate still launches the
processes, moves the data and saves the checkpoints.

- tensor (default): a (data_parallel x tensor_parallel) DeviceMesh over the launched processes; every block
  is sharded by the tensor-parallel plan of the net's Split, and across data-parallel groups FSDP2 shards the rest
  (`replicas` > 1: HSDP, sharded within data_parallel_size / replicas groups, replicated across them).
- layers: one process; consecutive layer groups (cut between the Split's blocks) on consecutive devices.
"""

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from omegaconf import DictConfig
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh

from ...errors import ConfigError
from ...parallel.launcher import free_port
from ...parallel.layout import Layout
from ...parallel.sharding import (
    FsdpSettings,
    OnMeta,
    check_init,
    check_layer_split,
    check_mode,
    check_precision,
    check_tensor_parallel,
    default_layer_devices,
    materialize,
    mesh_sizes,
    move_buffers,
    parallelize,
    place_layer_groups,
)
from ...parallel.split import find_split
from ...runtime.async_saves import CheckpointWriter
from ...runtime.checkpoint_forms import (
    SHARDS,
    drop_unsaved_state,
    fill_tied,
    form_of,
    load_optimizer_state,
    one_name_each,
    parameter_names,
    restore_hyperparameters,
    saved_entries,
)
from ...runtime.resuming import write_mesh
from ..checkpoints import has_no_weights, no_net, read_whole, saved_by_layers
from . import Strategy


class ModelParallel(Strategy):
    name = "model_parallel"
    supports_batch_size_search = False
    compiles_per_block = True

    def __init__(
        self,
        mode: str = "tensor",
        tensor_parallel_size: int | str = "auto",
        data_parallel_size: int | str = "auto",
        replicas: int = 1,
        devices: list[str] | None = None,
        init: str = "full",
        **kwargs: Any,
    ) -> None:
        check_mode(mode)
        check_init(init)
        super().__init__(**kwargs)
        self.mode, self.init_mode = mode, init  # init: full or meta (sharding.materialize)
        self.requested = (data_parallel_size, tensor_parallel_size)
        self.layer_devices = [torch.device(device) for device in devices or default_layer_devices()]
        self.sizes = (1, 1)
        self.on_meta: OnMeta | None = None
        self.build: Callable[[], nn.Module] | None = None  # the net's build, again for init=full
        self.precision = "32-true"
        # strategy=fsdp's HSDP, resharding and offload (fsdp.py); here HSDP x tensor parallel and the defaults
        self.fsdp = FsdpSettings(replicas=replicas)

    def processes(self, launched: int, devices: int) -> int:
        if self.mode == "layers" and launched > 1:
            raise ConfigError("strategy.mode=layers is one process: run it with python, not a launcher")
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", launched))
        self.sizes = mesh_sizes(*self.requested, max(launched // per_node, 1), per_node)
        return launched

    def launch(self, run: Callable[[], None], devices: int) -> None:
        if self.mode == "tensor" and "LOCAL_RANK" not in os.environ:
            # python -m: a process group of this one process, as `torchrun --nproc_per_node=1` would start (FSDP2
            # shards over a DeviceMesh, which needs one; Lightning's engine makes the same). One process sharding
            # over itself is what fsdp's strategy.offload=true needs to train a model larger than its device.
            port = os.environ.get("MASTER_PORT") or str(free_port())
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
            os.environ.update(MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"), MASTER_PORT=port)
        run()

    def check_layout(self, processes: int, net: nn.Module, cfg: DictConfig) -> None:
        check_precision(self.name, cfg.trainer.precision)
        self.precision = cfg.trainer.precision
        find_split(net, "model_parallel")  # first: a model without a split cannot be split whatever the layout
        if self.mode == "layers":
            check_layer_split(net, self.layer_devices)
            return
        dp, tp = self.sizes  # (one process: FSDP2 over a group of itself, noted by check_config)
        if dp < 1 or tp < 1 or dp * tp != processes:
            raise ConfigError(
                f"strategy.data_parallel_size={dp} x strategy.tensor_parallel_size={tp} must equal the {processes} "
                "launched processes"
            )
        self.fsdp.check(dp, tp)
        check_tensor_parallel(net, tp, processes)

    def data_parallel(self, process_index: int, processes: int) -> tuple[int, int]:
        dp, tp = self.sizes
        # The mesh is laid out row-major: ranks 0..tp-1 form data-parallel group 0, and so on.
        return dp, process_index // tp

    def build_net(self, build: Callable[[], nn.Module]) -> nn.Module:
        if self.mode == "layers":
            return build()
        self.build = build
        with OnMeta() as self.on_meta:  # no memory: each process allocates only its shards, in prepare
            return build()

    def prepare(
        self, accelerator: Accelerator, net: nn.Module, optimizer: Callable[..., torch.optim.Optimizer]
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        # Not accelerator.prepare: it would wrap the net in DDP. Each process keeps only its shards.
        if self.mode == "layers":
            place_layer_groups(net, self.layer_devices)
        else:
            names = ("data_parallel", "tensor_parallel")
            mesh = init_device_mesh(accelerator.device.type, self.sizes, mesh_dim_names=names)
            parallelize(net, mesh, self.precision, self.fsdp)
            full_build = self.build if self.init_mode == "full" else None  # the values strategy=single draws:
            materialize(net, self.fsdp.shards_device(accelerator.device), self.on_meta.rng_state, full_build)
            if self.fsdp.offload:
                move_buffers(net, accelerator.device)
        return net, optimizer(net.parameters())

    def devices_in_use(self) -> list[torch.device]:
        return self.layer_devices if self.mode == "layers" else []

    def checkpoint_objects(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[Any]:
        return [WholeState(model, optimizer)] if self.mode == "layers" else []  # one process holds it all

    @property
    def writes_checkpoint_parts(self) -> bool:
        return self.mode == "tensor"

    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> "ShardedState | None":
        return ShardedState(model, optimizer, self.name, self.sizes) if self.writes_checkpoint_parts else None

    def check_resume(self, checkpoint: Path | None, processes: int, given: bool = False) -> None:
        """mode=layers: refuse another preset's checkpoint (it keeps its net elsewhere: saved_by_layers), before
        training; mode=tensor: one saved with another tensor-parallel size or mesh (Strategy.check_resume)."""
        if self.mode == "tensor":
            super().check_resume(checkpoint, processes, given)
        elif checkpoint is not None and not saved_by_layers(checkpoint):
            if has_no_weights(checkpoint):
                raise no_net(checkpoint)
            raise ConfigError(
                f"{checkpoint} was saved by another preset than strategy=model_parallel strategy.mode=layers, whose "
                "checkpoint keeps the net where the others keep their schedule: resume it under another preset"
            )

    def mesh(self, processes: int) -> tuple[int, int]:
        return self.sizes

    def device_layout(self, processes: int) -> Layout:
        if self.mode == "layers":
            return Layout(stages=len(self.layer_devices))
        return self.fsdp.layout(*self.sizes)


class ShardedState:
    """The sharded net and optimizer, written and read by every process with torch.distributed.checkpoint (DCP):
    each writes its own shards (`<checkpoint>/sharded/`), no process gathers the whole model, and a checkpoint
    loads on another mesh or number of processes (DCP reshards). load_trained reads it on one device."""

    options = StateDictOptions()
    form = SHARDS  # the form it writes (checkpoint_forms.py); another preset's is read whole

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, preset: str, mesh: tuple[int, int] = (1, 1)
    ) -> None:
        self.model, self.optimizer = model, optimizer
        self.preset, self.mesh = preset, mesh  # mesh: (data, tensor) parallel sizes, recorded with the parts
        self.writer = CheckpointWriter()  # checkpoint.async=true: in the background (training.py)

    def _state(self) -> dict[str, Any]:
        # Creates Adam's state if no step ran yet.
        model, optimizer = get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": model, "optimizer": optimizer}

    def save(self, folder: Path) -> None:
        self.writer.write(self._state(), folder)
        write_mesh(folder, *self.mesh, self.preset)

    def load(self, checkpoint: Path) -> None:
        folder = checkpoint / "sharded"
        if not folder.is_dir() or form_of(folder) != self.form:  # another preset's checkpoint
            self._load_whole(*read_whole(checkpoint))
            return
        state = self._read(folder)
        self._set(state["model"], state["optimizer"], self.options)

    def _read(self, folder: Path) -> dict[str, Any]:
        """The net's and optimizer's entries of this process in the DCP folder, read in place. The optimizer's of the
        parameters the checkpoint holds no state for (that never had a gradient) are not asked for."""
        state = self._state()
        drop_unsaved_state(state["optimizer"], saved_entries(folder), "optimizer")
        dcp.load(state, checkpoint_id=folder)
        return state

    def _set(self, model: dict[str, Any], optimizer: dict[str, Any], options: StateDictOptions) -> None:
        """Load the net's state and the optimizer's (those parameters left without state, as saved)."""
        set_model_state_dict(self.model, model, options=options)
        load_optimizer_state(self.model, self.optimizer, optimizer, options)

    def _load_whole(self, model: dict[str, Any], optimizer: dict[str, Any]) -> None:
        """One device's net and optimizer state (read_whole), each process keeping its shards."""
        names = parameter_names(self.model.named_parameters(remove_duplicate=False))
        fill_tied(model, names)
        options = StateDictOptions(full_state_dict=True)
        optimizer = one_name_each(optimizer, names)
        self._set(model, optimizer, options)
        restore_hyperparameters(self.optimizer, optimizer, names)


class WholeState:
    """The net and optimizer state of strategy.mode=layers (one process holds all of it), for save_state;
    loading places it on the layer groups' devices again. Any preset can load the saved net."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.options = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def state_dict(self) -> dict[str, Any]:
        with quiet_redistribution():
            model, optimizer = get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": model, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state["model"], options=options)
        load_optimizer_state(self.model, self.optimizer, state["optimizer"], options)


@contextmanager
def quiet_redistribution() -> Iterator[None]:
    """Gathering a net sharded over both mesh dimensions (dp x tp) makes every rank log that it needs two
    all_gathers "which may give inconsistent results". That is about reductions; a gather copies exactly, so
    the warning is noise in the run's output while a checkpoint is written."""
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
