"""How big the configured model is, and what each preset needs per device: memory and gradient traffic.

The model is built on the meta device (shapes only, no memory), so a model far bigger than this machine can be
planned for. Memory per device = weights + gradients + optimizer state + activations:
- weights and gradients in fp32 (4 bytes each): the mixed precisions keep fp32 master weights;
- optimizer state as the configured optimizer really keeps it (measured on a small tensor after one step);
- activations: the bytes autograd saves for backward in one forward of the per-device batch, measured on the
  meta device (a tensor saved by two operations counts twice, so this errs on the high side), halved under
  bf16-mixed / 16-mixed (activations saved in 16 bits; an estimate: some operations keep fp32), at the precision
  training would use (trainer.precision=auto resolved as train resolves it, precision.py).
Not counted: the CUDA context and allocator caches (about 0.5-1 GB per GPU): fits() leaves 10% free for them.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from ..config.objects import build_object
from ..data.batch_sizes import per_device_batch_size
from ..data.checks import first_sample, not_logits
from ..data.loading import Data
from ..engine.launching import DP_GATHERS_OUTPUTS
from ..errors import ConfigError
from ..parallel.batchnorm import uses_batchnorm
from ..parallel.pipelining import bubble_fraction
from ..parallel.sharding import WRAPPED_BEFORE_THE_FIRST_FORWARD, unsized_parameter
from ..parallel.split import find_split, has_split, layers, matches, pipeline_stage
from ..runtime.optimization import check_optimization, check_trainable

FP32 = 4
USABLE = 0.9  # share of a device's memory a plan may fill
REFUSES_BATCHNORM = "refuses BatchNorm"  # memory rows' reasons for no figure that are not memory (doctor.show)
REFUSES_LAZY = "refuse a lazy layer"
CANNOT_SHARD = "cannot shard the 0-dim parameter"
NO_PLAN = "model_parallel: the model has no tensor-parallel plan (its Split's tensor_parallel, parallel/split.py)"
NOT_A_CHAIN = "pipeline: the forward is not its Split's parts one after another on one tensor (two towers, a mask)"


@dataclass
class ModelFacts:
    parameters: int
    optimizer_state_per_parameter: int  # bytes
    activation_bytes_per_sample: float  # at the configured precision
    output_bytes_per_sample: float  # the net's output (logits), at the configured precision
    tokens_per_sample: int  # positions the loss predicts per sample: 1 for a classifier, seq_len for a language model
    tensor_parallel_parameters: int  # parameters the model's tensor-parallel plan shards (0: no plan)
    blocks: int  # the blocks a pipeline cuts between (0: the model has no Split)
    stage_parameters: dict[int, list[int]]  # pipeline stages -> parameters of each stage
    stage_activation_bytes_per_sample: dict[int, list[float]]
    sample: torch.Tensor  # one sample's x on the meta device (shape, dtype): the doctor builds a dataset once
    batchnorm: bool = False  # fsdp, model_parallel, pipeline and dp over 2+ devices refuse it (parallel/batchnorm.py)
    unused: tuple[str, ...] = ()  # parameters no gradient reaches (an auxiliary head left out): ddp must be told
    chain: bool = True  # the Split's parts run one after another on one tensor (else no pipeline: two towers, a mask)
    lazy: str | None = None  # a parameter sized at the first forward (LazyLinear's), which the wrapping presets refuse
    scalar: str | None = None  # a 0-dim parameter (a learned temperature), which FSDP2 cannot shard

    @property
    def state_bytes(self) -> int:
        """Weights + gradients + optimizer state of the whole model."""
        return self.parameters * (2 * FP32 + self.optimizer_state_per_parameter)


def check_model_settings(cfg: DictConfig) -> None:
    """The training's own checks of the settings the doctor and the bench build from before any training (the global
    batch, the optimizer, its schedule): a batch of 0 or a negative learning rate was a traceback there."""
    per_device_batch_size(cfg.data.batch_size, 1)
    check_optimization(cfg, build_object(cfg.model.optimizer), build_object(cfg.scheduler))


def model_facts(cfg: DictConfig, batch: int, stage_counts: list[int], precision: str) -> ModelFacts:
    """Measure the configured net on the meta device, with a meta batch of `batch` samples shaped like the data's;
    `precision`: a resolved one (precision.resolve_precision), 32-true, bf16-mixed or 16-mixed."""
    with torch.device("meta"):
        net = build_object(cfg.model.net)
    check_trainable(net)
    lazy = unsized_parameter(net)  # (before the forwards below size it)
    example = example_input(cfg, net, batch)
    scale = 0.5 if precision in ("bf16-mixed", "16-mixed") else 1.0
    stages: dict[int, list[int]] = {}
    stage_activations: dict[int, list[float]] = {}
    chain = True
    if has_split(net):
        for count in stage_counts:
            try:
                parts = [pipeline_stage(net, i, count) for i in range(count)]
            except ValueError:  # more stages than the model has blocks
                continue
            try:
                saved = chain_saved_bytes(parts, example)
            except (RuntimeError, TypeError, ValueError, IndexError):  # not a chain (two towers): no pipeline of it
                chain = False
                break
            stages[count] = [count_parameters(part) for part in parts]
            stage_activations[count] = [nbytes * scale / batch for nbytes in saved]
    nbytes, output = saved_bytes(net, example)
    if not isinstance(output, torch.Tensor):
        raise not_logits(type(net).__name__, output)
    if output.requires_grad:  # on the meta device too: which parameters the backward reaches
        output.float().sum().backward()
    return ModelFacts(
        parameters=count_parameters(net),
        optimizer_state_per_parameter=optimizer_state_bytes(cfg),
        activation_bytes_per_sample=nbytes * scale / batch,
        output_bytes_per_sample=output.numel() * FP32 * scale / batch,
        tokens_per_sample=tokens_per_sample(output),
        tensor_parallel_parameters=tensor_parallel_parameters(net),
        blocks=len(layers(net, "pipeline")[2]) if stages else 0,
        stage_parameters=stages,
        stage_activation_bytes_per_sample=stage_activations,
        batchnorm=uses_batchnorm(net),
        unused=tuple(name for name, p in net.named_parameters() if p.requires_grad and p.grad is None),
        chain=chain,
        lazy=lazy,
        scalar=next((name for name, param in net.named_parameters() if param.dim() == 0), None),
        sample=example[0],
    )


def example_input(cfg: DictConfig, net: nn.Module, batch: int, split: Data | None = None) -> torch.Tensor:
    """A meta batch shaped like the data's inputs: the shape and dtype of the training split's first sample (images
    of a dataset of yours, say); for a stream, which cannot be read by index, num_features values per sample,
    token ids (int64) for a net that reads them (one with an nn.Embedding, as data.check_input decides), else
    float32 features. `split`: the training split, if built already (training_split)."""
    if (sample := first_input(cfg, split)) is not None:
        return torch.zeros(batch, *sample.shape, dtype=sample.dtype, device="meta")
    if "num_features" not in cfg.data:
        raise ConfigError("the model is sized from data.num_features; this data config has none")
    reads_ids = any(isinstance(module, nn.Embedding) for module in net.modules())
    dtype = torch.long if reads_ids else torch.float32
    return torch.zeros(batch, cfg.data.num_features, dtype=dtype, device="meta")


def training_split(cfg: DictConfig) -> Data | None:
    """The data with its training split built (None: a stream, which is not read by index and maybe remote, or data
    without a dataset). A dataset class that refuses its arguments: one line (data.loading.Data)."""
    if cfg.data.get("dataset") is None:
        return None
    data = Data(build_object(cfg.data.dataset), splits=["train"])
    if data.streams:
        return None
    data.setup()
    return data


def first_input(cfg: DictConfig, split: Data | None = None) -> torch.Tensor | None:
    """The training split's first x, read as the training reads it (None: a stream, an empty split, or data without
    a dataset). `split`: the training split, if built already (training_split)."""
    data = split or training_split(cfg)
    if data is None:
        return None
    sample = first_sample(data)
    if sample is None or isinstance(sample, torch.Tensor):
        return None if sample is None else sample[0]
    raise ConfigError(
        f"the doctor and the bench size the model on its input as one tensor, but the data's x is a "
        f"{type(sample).__name__}: measure it on a model and data that take one (the training takes yours as it is)"
    )


def tokens_per_sample(output: torch.Tensor) -> int:
    """Positions a sample's output predicts: 1 for a classifier's (batch, classes), T for a language model's
    (batch, T, vocab)."""
    return math.prod(output.shape[1:-1])


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def chain_saved_bytes(parts: list[nn.Module], x: torch.Tensor) -> list[int]:
    """saved_bytes of each pipeline stage, run one after another as the pipeline runs them."""
    saved = []
    for part in parts:
        nbytes, x = saved_bytes(part, x)
        saved.append(nbytes)
        x = x.detach()
    return saved


def saved_bytes(module: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes autograd keeps for backward during module(x), parameters (and views of them) excluded."""
    params = {id(p) for p in module.parameters()}
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        base = tensor._base if tensor._base is not None else tensor
        if id(base) not in params and id(tensor) not in params:
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = module(x)
    return total, out


def optimizer_state_bytes(cfg: DictConfig) -> int:
    """Bytes of optimizer state per fp32 parameter, as the configured optimizer keeps it after a step."""
    param = nn.Parameter(torch.zeros(64))
    param.grad = torch.zeros(64)
    optimizer = build_object(cfg.model.optimizer)([param])
    optimizer.step()
    per_param = [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in per_param if t.numel() == param.numel()) // param.numel()


def tensor_parallel_parameters(net: nn.Module) -> int:
    if not has_split(net):
        return 0
    patterns = list(find_split(net, "model_parallel")[1].tensor_parallel)
    return sum(
        count_parameters(module)
        for name, module in net.named_modules()
        if any(matches(name, pattern) for pattern in patterns)
    )


def mesh(devices: int, per_node: int) -> tuple[int, int]:
    """(data_parallel, tensor_parallel) as the model_parallel preset's "auto" lays it out: tensor parallel
    within a node, data parallel (FSDP2) across nodes."""
    tensor = math.gcd(devices, per_node)
    return devices // tensor, tensor


def memory_per_device(
    facts: ModelFacts,
    preset: str,
    devices: int,
    per_node: int,
    batch: int,
    microbatches: int,
    schedule: str,
    tensor: int | None = None,
    pipelines: int = 1,
) -> tuple[float | None, str]:
    """Bytes the most loaded device of `preset` on `devices` needs at global batch `batch`, and what it holds.
    None (with the reason) when the layout cannot run. model_parallel: `tensor` parallel size (default: the
    preset's "auto" mesh); pipeline: `pipelines` side by side (strategy.data_parallel_size), each with its share of
    the batch and devices / pipelines stages."""
    state, act = facts.state_bytes, facts.activation_bytes_per_sample
    grads = facts.parameters * FP32
    if preset == "single":
        return (state + act * batch, "everything") if devices == 1 else (None, "one device only")
    if facts.lazy and preset in WRAPPED_BEFORE_THE_FIRST_FORWARD:
        wrapping = ", ".join(WRAPPED_BEFORE_THE_FIRST_FORWARD)  # (one reason for all: the doctor shows it once)
        return None, f"{wrapping} {REFUSES_LAZY}: they take the net before its first forward sizes {facts.lazy}"
    if facts.batchnorm and (preset in ("model_parallel", "pipeline") or preset in ("fsdp", "dp") and devices > 1):
        layers = " (strategy.mode=layers, one process over a machine's devices, trains it)" * (
            preset == "model_parallel"
        )
        return None, f"{preset} {REFUSES_BATCHNORM}: its statistics would not be the whole batch's{layers}"
    if preset in ("ddp", "dp") and batch % devices:
        return None, f"batch {batch} does not split over {devices}"
    if preset == "ddp":
        return state + grads + act * batch / devices, "full replica + gradient buckets + batch/N activations"
    if preset == "dp":
        return dp_memory(facts, devices, batch)[0], f"device 0, the fullest: {DP_DEVICE_0}"
    if preset == "fsdp":
        if facts.scalar:
            return None, f"fsdp {CANNOT_SHARD} {facts.scalar} (FSDP2)"
        if batch % devices:
            return None, f"batch {batch} does not split over {devices}"
        return (
            state / devices + act * batch / devices,
            "1/N of weights, gradients, optimizer state + batch/N activations",
        )
    if preset == "model_parallel":
        if not facts.tensor_parallel_parameters:
            return None, NO_PLAN
        data, tensor = (devices // tensor, tensor) if tensor else mesh(devices, per_node)
        if facts.scalar and (data > 1 or tensor == 1):  # FSDP2 over the replicas
            return None, f"model_parallel's FSDP2 {CANNOT_SHARD} {facts.scalar}"
        if batch % data:
            return None, f"batch {batch} does not split over {data} replicas"
        sharded = facts.tensor_parallel_parameters
        replicated = facts.parameters - sharded
        per_device_params = (sharded / tensor + replicated) / data  # FSDP2 shards the rest over the replicas
        return (
            per_device_params * (2 * FP32 + facts.optimizer_state_per_parameter) + act * batch / data / tensor,
            f"mesh dp={data} x tp={tensor}",
        )
    if preset == "pipeline":
        stages, share = devices // pipelines, batch // pipelines  # each pipeline reads its share of the batch
        if not facts.chain:
            return None, NOT_A_CHAIN
        if devices % pipelines or stages not in facts.stage_parameters:
            return None, "the model cannot be cut into that many stages"
        if batch % (microbatches * pipelines) or microbatches < stages:
            return None, f"needs {stages}+ micro-batches dividing the batch of each of {pipelines} pipeline(s)"
        worst = 0.0
        for stage, (params, act_stage) in enumerate(
            zip(facts.stage_parameters[stages], facts.stage_activation_bytes_per_sample[stages], strict=True)
        ):
            # GPipe keeps every micro-batch's activations until backward; 1F1B at most (stages - stage) of them.
            in_flight = microbatches if schedule == "gpipe" else min(stages - stage, microbatches)
            total = (
                params * (2 * FP32 + facts.optimizer_state_per_parameter) + act_stage * share / microbatches * in_flight
            )
            worst = max(worst, total)
        side_by_side = f"{pipelines} pipelines of {stages} stages, " if pipelines > 1 else ""
        bubble = bubble_fraction(stages, microbatches)
        return worst, f"{side_by_side}{schedule}, {microbatches} micro-batches, bubble {bubble:.0%}"
    raise ValueError(f"unknown preset {preset}")


# Why strategy=dp's device 0 fills first (strategies/dp.py).
DP_DEVICE_0 = "device 0 keeps the optimizer state and the gradients the replicas reduce onto it" + (
    ", and the gathered outputs" if DP_GATHERS_OUTPUTS else ""
)


def dp_memory(facts: ModelFacts, devices: int, batch: int) -> tuple[float, float]:
    """strategy=dp's (device 0, each other device). Every device holds a copy of the weights, its gradients and
    its share of the activations; device 0's copy is the model itself, with its optimizer state, and, where the engine
    gathers the outputs of the whole batch on it (DP_GATHERS_OUTPUTS), those outputs with the softmax the loss
    keeps and their gradient: three copies."""
    share = facts.activation_bytes_per_sample * batch / devices
    first = facts.state_bytes + share
    if DP_GATHERS_OUTPUTS and devices > 1:  # one device runs the net itself: nothing is gathered
        first += 3 * facts.output_bytes_per_sample * batch
    return first, facts.parameters * 2 * FP32 + share


def gradient_traffic(parameters: int, devices: int, busbw_gbs: float | None) -> dict[str, Any]:
    """Bytes each step moves to average fp32 gradients over `devices`, and the time at bus bandwidth busbw.

    Ring all-reduce: each device sends (and receives) 2 (N/P)(P-1) bytes, about 2N whatever P. Parameter server:
    the server receives P-1 gradient copies and sends P-1 updates, N(P-1) each way: it grows with P.
    """
    size = parameters * FP32
    ring = 2 * size / devices * (devices - 1)
    server = size * (devices - 1)
    seconds = (lambda nbytes: nbytes / (busbw_gbs * 1e9)) if busbw_gbs else (lambda nbytes: None)
    return {
        "devices": devices,
        "gradient_bytes": size,
        "ring_bytes_per_device": ring,
        "parameter_server_bytes": server,
        "ring_seconds": seconds(ring),
        "parameter_server_seconds": seconds(server),
    }
