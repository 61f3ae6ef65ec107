"""model_parallel: split the model itself over devices, for models too big for one device's memory.

Two modes, chosen by `strategy.mode`:

- tensor: Lightning's ModelParallelStrategy. The processes form a 2D DeviceMesh
  (data_parallel x tensor_parallel). Each tensor-parallel group shards the model by the tensor-parallel plan
  of its `Split` (parallel/split.py) and reads the same batch; across data-parallel groups the model is
  also sharded with FSDP2 `fully_shard`, which averages the gradients of the replicas (`replicas` > 1: HSDP,
  sharded within data_parallel_size / replicas groups, replicated across them).
- layers: one process, the model cut into consecutive groups of layers (between the blocks of its Split), group i
  on device i; activations are copied from one device to the next. Simple, but only one device works
  at a time (the pipeline preset overlaps them).
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy, SingleDeviceStrategy
from torch import nn
from torch.utils.hooks import RemovableHandle

from ...errors import ConfigError
from ...parallel.layout import Layout
from ...parallel.sharding import (
    FsdpSettings,
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
from ...runtime.async_saves import CheckpointWriter
from ...runtime.checkpoint_forms import SHARDS, form_of
from ...runtime.resuming import write_mesh
from .sharded_checkpoints import load_parts, load_whole, read_whole, write_parts


def model_parallel(
    mode: str = "tensor",
    tensor_parallel_size: int | Literal["auto"] = "auto",
    data_parallel_size: int | Literal["auto"] = "auto",
    replicas: int = 1,
    devices: list[str] | None = None,
    timeout: timedelta = timedelta(minutes=10),
    init: str = "full",
) -> "TensorParallelStrategy | LayerSplitStrategy":
    """The preset's `_target_`: one strategy per mode. Settings of the other mode are ignored."""
    check_mode(mode)
    check_init(init)
    if mode == "tensor":
        strategy = TensorParallelStrategy(
            init=init,
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            timeout=timeout,
        )
        strategy.fsdp = FsdpSettings(replicas=replicas)
        return strategy
    return LayerSplitStrategy(devices)


class TensorParallelStrategy(ModelParallelStrategy):
    """ModelParallelStrategy that knows its data-parallel layout before the processes start, and builds the
    model on the meta device (engine/training.py builds it in `trainer.init_module(empty_init=True)`): only each rank's
    shards are ever allocated, with the values strategy=single draws (sharding.materialize)."""

    builds_on_meta = True
    compiles_per_block = True  # compile=true (compilation.py)
    preset = "model_parallel"
    fsdp = FsdpSettings()  # strategy=fsdp's HSDP, resharding and offload (fsdp.py); model_parallel: the defaults
    _init_rng_state: torch.Tensor | None = None

    def __init__(self, *args: Any, init: str = "full", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checkpoint_writer = CheckpointWriter()  # checkpoint.async=true: in the background (training.prepare)
        self.init_mode = (
            init  # full: values copied from a whole build on the CPU; meta: each module's reset_parameters()
        )

    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        if empty_init:  # the model's build (Lightning enters this again, without it, around configure_model)
            self._init_rng_state = torch.random.get_rng_state()  # what a normal build would draw from
        with super().tensor_init_context(empty_init):
            yield

    def _sizes(self) -> tuple[int, int]:
        """(data_parallel_size, tensor_parallel_size); "auto" fills in from the other and the world size."""
        return mesh_sizes(self._data_parallel_size, self._tensor_parallel_size, self.num_nodes, self.num_processes)

    @property
    def data_parallel_size(self) -> int:
        return self._sizes()[0]

    @property
    def tensor_parallel_size(self) -> int:
        return self._sizes()[1]

    @property
    def data_parallel_rank(self) -> int:
        # The mesh is laid out row-major: ranks 0..tp-1 form data-parallel group 0, and so on.
        return self.global_rank // self.tensor_parallel_size

    def device_layout(self) -> Layout:
        return self.fsdp.layout(*self._sizes())

    def setup_environment(self) -> None:
        self._data_parallel_size, self._tensor_parallel_size = self._sizes()
        super().setup_environment()

    def check_layout(self, trainer: L.Trainer, model: nn.Module, global_batch_size: int) -> None:
        """Refuse a mesh that does not fit the processes or a model that does not divide over it."""
        dp, tp = self._sizes()
        if dp < 1 or tp < 1 or dp * tp != self.world_size:
            raise ConfigError(
                f"strategy.data_parallel_size={dp} x strategy.tensor_parallel_size={tp} must equal the processes: "
                f"trainer.devices={self.num_processes} x trainer.num_nodes={self.num_nodes} = {self.world_size}"
            )
        self.fsdp.check(dp, tp)
        check_tensor_parallel(model, tp, self.world_size)
        check_precision(self.preset, trainer.precision)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if self.checkpoint_writer.background:  # the folder Lightning writes (at once), written in the background
            path = Path(self.broadcast(filepath))
            write_parts(checkpoint, path, self.checkpoint_writer, self.is_global_zero)
        else:
            super().save_checkpoint(checkpoint, filepath, storage_options)
        if Path(filepath).is_dir():  # the folder of every rank's shards
            write_mesh(Path(filepath), *self._sizes(), self.preset)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Shards, as Lightning reads them (load_parts: without the optimizer state of parameters that never had a
        gradient); a checkpoint of another preset (a whole-model file, a pipeline's stages) read whole, each process
        keeping its shards of it."""
        path = Path(self.broadcast(checkpoint_path))
        if form_of(path) == SHARDS:
            return load_parts(path, self.model, self.optimizers, self.lightning_module.strict_loading, weights_only)
        checkpoint = read_whole(path, weights_only)
        load_whole(self.model, self.optimizers, checkpoint)
        return checkpoint

    def parallelize(self, net: nn.Module, build: Callable[[], nn.Module] | None = None) -> None:
        """Shard `net` in place and allocate this rank's shards (called from LightningModule.configure_model, with
        the net's own build for strategy.init=full); a no-op the second time."""
        parallelize(net, self.device_mesh, self.precision_plugin.precision, self.fsdp)
        if self._init_rng_state is not None:
            device = self.fsdp.shards_device(self.root_device)
            materialize(net, device, self._init_rng_state, build if self.init_mode == "full" else None)

    def model_to_device(self) -> None:
        if self.fsdp.offload:  # the shards stay in host memory (FSDP2 copies each layer's in for its compute)
            move_buffers(self.model, self.root_device)
        else:
            super().model_to_device()


class LayerSplitStrategy(SingleDeviceStrategy):
    """One process; layer group i of the model lives on devices[i]. The batch and the loss live on devices[0]."""

    data_parallel_size = 1
    data_parallel_rank = 0
    compiles_per_block = True  # compile=true (compilation.py)

    def __init__(self, devices: list[str] | None = None) -> None:
        self.devices = [torch.device(device) for device in devices or default_layer_devices()]
        self.devices_in_use = self.devices  # read by the memory monitor
        super().__init__(device=self.devices[0])
        self._hooks: list[RemovableHandle] = []

    def device_layout(self) -> Layout:
        return Layout(stages=len(self.devices))

    def check_layout(self, trainer: L.Trainer, model: nn.Module, global_batch_size: int) -> None:
        check_layer_split(model, self.devices)

    def model_to_device(self) -> None:
        # Lightning moves the whole module to the root device here (at fit, and again at test);
        # put each layer group back on its own device afterwards.
        super().model_to_device()
        for handle in self._hooks:
            handle.remove()
        self._hooks = place_layer_groups(self.model, self.devices)

    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        # Lightning moved the optimizer state to the root device; it belongs with its parameter.
        for optimizer in self.optimizers:
            for param, state in optimizer.state.items():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        state[key] = value.to(param.device)
