"""Models as a user brings them, written the obvious way: the presets that split a model must train them as
strategy=single does, or refuse them in one line before training."""

import os
import shutil
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.split import Split, register_split


class PositionSummed(nn.Module):
    """An embedding, then a learned position vector added in the forward (as a transformer adds its position
    embedding), blocks, a head. Its Split names the modules, but the forward is not their chain."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 32, depth: int = 2, **_: object) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, hidden)
        self.position = nn.Parameter(torch.randn(hidden) * 0.1)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(depth))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.position
        for block in self.blocks:
            h = block(h)
        return self.head(h)


register_split(PositionSummed, Split(first=["embed"], blocks=["blocks.*"], last=["head"]))


class InterruptedOnce(ResidualMLP):
    """Ctrl-C from within: SIGINT to its own process in the forward of training step `at` (0-based), as a terminal
    sends it to every process of the training (`signal_name=SIGKILL`: a crash of every process instead). Only once:
    it leaves `marker` (one per process), so the continued run trains through. `only_rank`: that process alone;
    `to_command`: to the training command that started torchrun (the Accelerate engine's trainer.devices=N without
    a launcher), which passes it on to torchrun's agent, which passes it on to every process."""

    def __init__(
        self,
        *args,
        marker: str,
        at: int = 4,
        signal_name: str = "SIGINT",
        children: bool = False,
        only_rank: int | None = None,
        to_command: bool = False,
        in_eval: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.in_eval = in_eval  # in the forward of evaluation batch `at` instead (Lightning's sanity check first)
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"  # Lightning's own workers: LOCAL_RANK
        self.marker, self.at, self.calls = Path(f"{marker}.{rank}"), at, 0
        if only_rank is not None and int(rank) != only_rank:  # the signal reaches that process alone
            self.marker.touch()
        self.to_command = to_command  # a Ctrl-C where the command runs
        self.signal = getattr(signal, signal_name)
        self.with_children = children  # its child processes too (wandb's service), as SLURM signals every one of a step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training != self.in_eval and x.device.type != "meta" and not self.marker.exists():  # (meta: checks)
            if self.calls == self.at:
                self.marker.touch()
                if self.signal == signal.SIGINT and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
                    signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's (a test's: ignored)
                for pid in child_processes() if self.with_children else []:
                    os.kill(pid, self.signal)
                os.kill(parent_of(os.getppid()) if self.to_command else os.getpid(), self.signal)
                if self.to_command:  # passed on by the command, then torchrun's agent: under load, later than the
                    reached(signal.getsignal(self.signal))  # training's last logged step, which then ended it
            self.calls += 1
        return super().forward(x)


def reached(handler: object) -> None:
    """Wait (at most a minute) until the training's Ctrl-C handler (runtime/interrupt.py) has been asked to stop, as
    a terminal's Ctrl-C would have asked it at once (Python runs a signal's handler in the main thread between two
    instructions: this one, sleeping)."""
    interrupt = getattr(handler, "__self__", None)
    for _ in range(6000):
        if getattr(interrupt, "requested", True):
            return
        time.sleep(0.01)


def parent_of(pid: int) -> int:
    """The process that started `pid` (its stat line's 4th field)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def child_processes() -> list[int]:
    """The processes this one started (from /proc: each one's parent is the 4th field of its stat line)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        if parent == os.getpid():
            children.append(int(stat.parent.name))
    return children


class PausedOnce(ResidualMLP):
    """Pauses in the forward of training step `at` (0-based) until `<marker>.go` exists, having left
    `<marker>.paused`: a training surely running while a test does something beside it. Only once (the markers
    stay)."""

    def __init__(self, *args, marker: str, at: int = 4, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.paused, self.go, self.at, self.calls = Path(f"{marker}.paused"), Path(f"{marker}.go"), at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.calls == self.at and not self.paused.exists():
            self.paused.write_text(str(os.getpid()))  # (which process paused)
            for _ in range(1200):  # at most a minute
                if self.go.exists():
                    break
                time.sleep(0.05)
        self.calls += self.training
        return super().forward(x)


def paused(marker: Path, training) -> bool:
    """Wait (at most a minute) until the training (a Popen-like process) running PausedOnce(marker=marker) pauses;
    False if it ended first or never got there."""
    for _ in range(1200):
        if Path(f"{marker}.paused").exists() or training.poll() is not None:
            break
        time.sleep(0.05)
    return Path(f"{marker}.paused").exists()


class AdamWKilledOnce(torch.optim.AdamW):
    """AdamW whose process SIGKILLs itself in optimizer step `at` (0-based), as a crash of every process does (each
    process counts its own steps): under every preset, pipeline's schedule included, which drives the net's stages
    without its forward. Only once: it leaves `marker` (one per process)."""

    def __init__(self, *args, marker: str, at: int = 6, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or 0  # Lightning's own workers: LOCAL_RANK
        self.marker, self.at, self.steps = Path(f"{marker}.{rank}"), at, 0

    def step(self, closure=None):
        if self.steps == self.at and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        self.steps += 1
        return super().step(closure)


class Conv1D(nn.Module):
    """A model library's linear layer with its weight stored transposed (in_features, out_features)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) * 0.02)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class Conv1DBlocks(nn.Module):
    """Blocks of Conv1D layers, with a tensor-parallel plan written as for nn.Linear."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 32, depth: int = 2, **_: object) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"up": Conv1D(hidden, 4 * hidden), "down": Conv1D(4 * hidden, hidden)}) for _ in range(depth)
        )
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block["down"](torch.relu(block["up"](h)))
        return self.head(h)


register_split(
    Conv1DBlocks,
    Split(
        first=["embed"],
        blocks=["blocks.*"],
        last=["head"],
        tensor_parallel={"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()},
    ),
)


class FusedAttention(nn.Module):
    """Self-attention with one Linear for q, k and v together (as many model libraries write it), named `fused`."""

    def __init__(self, dim: int, num_heads: int, fused: str) -> None:
        super().__init__()
        self.num_heads, self.fused = num_heads, fused
        setattr(self, fused, nn.Linear(dim, 3 * dim))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = getattr(self, self.fused)(x).chunk(3, dim=-1)  # after a colwise split: not its heads' q, k, v
        split = [t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for t in (q, k, v)]
        return self.out(nn.functional.scaled_dot_product_attention(*split).transpose(1, 2).flatten(-2))


class FusedQKV(nn.Module):
    """Sequences of tokens through blocks of fused-q/k/v attention, with the plan one writes for separate q, k, v."""

    FUSED = "qkv"

    def __init__(self, vocab_size: int = 32, dim: int = 16, depth: int = 2, num_heads: int = 2, **_: object) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(FusedAttention(dim, num_heads, self.FUSED) for _ in range(depth))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class FusedProj(FusedQKV):
    """The same, its fused layer under a name that says nothing (`proj`)."""

    FUSED = "proj"


for fused_model in (FusedQKV, FusedProj):
    plan = {f"blocks.*.{fused_model.FUSED}": ColwiseParallel(), "blocks.*.out": RowwiseParallel()}
    register_split(fused_model, Split(first=["embed"], blocks=["blocks.*"], last=["head"], tensor_parallel=plan))


class Scale(nn.Module):
    """A learned per-feature scale, with no reset_parameters() (as many hand-written modules)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class CustomInit(nn.Module):
    """Blocks whose weights the model's own __init__ draws again (as model libraries' init functions do), with a
    module that has no reset_parameters(): model_parallel's module-by-module init (strategy.init=meta) cannot
    reproduce its weights, the whole build on the CPU (init=full) does."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 32, depth: int = 2, **_: object) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {"up": nn.Linear(hidden, 2 * hidden), "down": nn.Linear(2 * hidden, hidden), "scale": Scale(hidden)}
            )
            for _ in range(depth)
        )
        self.head = nn.Linear(hidden, num_classes)
        for module in self.modules():  # the model's own init, not each Linear's reset_parameters
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.05)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block["scale"](block["down"](torch.relu(block["up"](h))))
        return self.head(h)


register_split(
    CustomInit,
    Split(
        first=["embed"],
        blocks=["blocks.*"],
        last=["head"],
        tensor_parallel={"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()},
    ),
)


class FrozenStart(ResidualMLP):
    """Fine-tuning's shape: the embedding and the first block frozen (requires_grad_(False)), the rest trained. Under a
    pipeline the first stage may hold no trainable parameter at all."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embed.requires_grad_(False)
        self.blocks[0].requires_grad_(False)


class CrashesInTraining(ResidualMLP):
    """A net with a bug that shows once it sees data: the checks before training pass (they run the forward on the
    meta device), the first real forward raises. A search's failing trial."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "meta":
            raise RuntimeError("a bug in the forward")
        return super().forward(x)


class WithLambda(ResidualMLP):
    """A net that keeps a lambda (a habit of users): it cannot be pickled, as Lightning's strategy=ddp_spawn pickles
    the training for its processes (the Accelerate engine's build theirs)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scale = lambda x: x * 1.0


class CtrlCWhileBuilt(ResidualMLP):
    """Ctrl-C while the training starts (built on the device, after the checks on the meta device), before the
    training answers Ctrl-C itself; `signal_name=SIGTERM`: a `kill PID` then."""

    def __init__(self, *args: object, signal_name: str = "SIGINT", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if self.head.weight.device.type != "meta" and signal_name == "SIGINT":
            raise KeyboardInterrupt  # (as a terminal's Ctrl-C: a test's process may have SIGINT ignored)
        if self.head.weight.device.type != "meta":
            os.kill(os.getpid(), getattr(signal, signal_name))


class RemovesItsRunFolder(ResidualMLP):
    """A training whose run folder is removed under it (by someone cleaning up outputs/) in training step 2."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.device.type != "meta":
            self.calls += 1
            if self.calls == 3:
                from hydra.core.hydra_config import HydraConfig

                shutil.rmtree(HydraConfig.get().runtime.output_dir)
        return super().forward(x)


class WithUnusedHead(ResidualMLP):
    """The template's net with an auxiliary head its forward leaves out (one a user trains in some runs only).
    Made after the net's own layers, so that the net starts as ResidualMLP does with the same seed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.auxiliary = nn.Linear(4, 2)


class Tagger(nn.Module):
    """A label for every step of a sequence, (batch, steps, features) -> (batch, steps, classes), as a tagger or a
    language model gives them: an embedding, blocks and a head, each on the one before's output (a chain)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 16, depth: int = 2, **_: object) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(depth))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


register_split(Tagger, Split(first=["embed"], blocks=["blocks.*"], last=["head"]))


class SmallCNN(nn.Module):
    """A convolutional net of images (batch, 3, H, W), which a flat batch of data.num_features values does not fit;
    it takes the classifier config's other keys (hidden, depth, ...) and leaves them."""

    def __init__(self, in_features: int, num_classes: int, **unused) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class TwoInputs(nn.Module):
    """A net of two inputs, x = (a, b): one Linear each, summed, a head."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 16, **_: object) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(in_features, hidden), nn.Linear(in_features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.head(torch.relu(self.a(x[0]) + self.b(x[1])))


class LongSkip(ResidualMLP):
    """The template's net with the embedding's output added again before the head: a skip connection from the first
    of its parts to the last (a U-Net's, in one line)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skipped = x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x + skipped))


class InterruptedOnceWithUnusedHead(InterruptedOnce):
    """InterruptedOnce with WithUnusedHead's auxiliary head: no step gives it a gradient, so AdamW keeps no state for
    it, which a training continued from a checkpoint must neither look for nor make up."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.auxiliary = nn.Linear(4, 2)


class LearnedTemperature(ResidualMLP):
    """The template's net with its logits divided by a learned 0-dim temperature (CLIP's logit scale is one)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.temperature = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) / self.temperature


class LazyFirstLayer(ResidualMLP):
    """The template's net with a first layer that takes its input size from the first forward (nn.LazyLinear)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embed = nn.LazyLinear(self.embed.out_features)


class TwoTowers(nn.Module):
    """x's two halves through a tower each (a two-tower model's), then one head: a Split of its towers serves fsdp
    and layers, but running them one after another (a pipeline's chain) fails."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 16, **_: object) -> None:
        super().__init__()
        self.half = in_features // 2
        self.towers = nn.ModuleList([nn.Linear(self.half, hidden), nn.Linear(in_features - self.half, hidden)])
        self.head = nn.Linear(2 * hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        halves = x[:, : self.half], x[:, self.half :]
        return self.head(torch.cat([tower(half) for tower, half in zip(self.towers, halves, strict=True)], dim=1))


register_split(TwoTowers, Split(first=[], blocks=["towers.*"], last=["head"]))


class FeaturesNormalized(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x, dim=-1)


class NormalizedHidden(ResidualMLP):
    """The template's net with its blocks' hidden features normalised (over all of them) between fc_in and fc_out:
    under its tensor-parallel plan, each rank would normalise its share of them, with no error."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for block in self.blocks:
            block.act = FeaturesNormalized()


class MaskedBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x) * mask


class Masked(nn.Module):
    """A sequence model whose blocks take the features and a padding mask: no pipeline stage can (one tensor is
    passed from stage to stage)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 16, depth: int = 2, **_: object) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(MaskedBlock(hidden) for _ in range(depth))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x.abs().sum(dim=-1, keepdim=True) > 0).float()
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(h)


register_split(Masked, Split(first=["embed"], blocks=["blocks.*"], last=["head"]))


def schedule_without_its_return(optimizer: torch.optim.Optimizer, total_steps: int) -> None:
    """A schedule of one's own that forgets to return what it makes (the training then had none to step)."""
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / total_steps)
