"""The baseline: a hand-written PyTorch loop over the same model, data, batch and optimisation.

python plain_loop.py <package> --epochs E --batch B [--hidden H --depth D --steps N --train-size S]   one process
torchrun --nproc_per_node=2 plain_loop.py ...                                                        DDP over gloo

Same seed, same generated data, same DataLoader settings, and the template's default optimisation: AdamW (fused)
over the same two parameter groups (no weight decay on norms and biases) and the default schedule (warmup, then
cosine decay) stepped once per optimizer step, built by the baked package's own functions. A ratio to this loop
then measures what the template adds around the step, not the optimisation the user asked for. No logging, no
progress bar, no checkpoints, no validation: the cheapest loop a user would write. plain_lightning.py builds the
same model, data and optimisation with `parts`.
"""

import argparse
import functools
import importlib
import os
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from step_timer import Recorder
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SEED = 42


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", help="the baked project's package (on PYTHONPATH)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=-1, help="stop after this many optimizer steps (-1: epochs)")
    parser.add_argument("--batch", type=int, default=256, help="the global batch")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--devices", type=int, default=1, help="processes (plain_lightning.py: Lightning starts them)")
    return parser.parse_args(argv)


def split(args: argparse.Namespace, name: str) -> Dataset:
    """The template's generated data (configs/data/synthetic.yaml, data.train_size=--train-size)."""
    synthetic = importlib.import_module(f"{args.package}.data.synthetic")
    return synthetic.SyntheticData(name, train_size=args.train_size, seed=SEED)


def parts(args: argparse.Namespace) -> tuple[nn.Module, Dataset, Callable]:
    """The net, the training split and a function that builds the optimizer and schedule over parameters: what the
    template builds at its defaults."""
    optimization = importlib.import_module(f"{args.package}.runtime.optimization")
    model_module = importlib.import_module(f"{args.package}.models.mlp")
    torch.manual_seed(SEED)
    dataset = split(args, "train")
    net = model_module.ResidualMLP(32, 8, hidden=args.hidden, depth=args.depth)  # configs/data/synthetic.yaml's sizes
    steps_per_epoch = len(dataset) // args.batch
    total_steps = optimization.total_steps(args.steps, args.epochs, steps_per_epoch)

    def optimisation(parameters) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        adamw = functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01, fused=True)  # model.optimizer
        optimizer = optimization.grouped_optimizer(adamw, parameters, no_decay_norms_and_biases=True)
        return optimizer, optimization.cosine(optimizer, total_steps, warmup_steps=10, min_lr_ratio=0.1)

    return net, dataset, optimisation


def main(args: argparse.Namespace) -> None:
    distributed = "RANK" in os.environ
    world, rank = 1, 0
    if distributed:
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
    net, dataset, optimisation = parts(args)
    sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=SEED, drop_last=True) if distributed else None
    loader = DataLoader(
        dataset, batch_size=args.batch // world, shuffle=sampler is None, sampler=sampler, drop_last=True
    )
    model = DistributedDataParallel(net) if distributed else net
    optimizer, scheduler = optimisation(model.parameters())

    recorder, step = Recorder(), 0
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            if step == args.steps:
                break
            recorder.batch_start(epoch)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
    recorder.save()
    # No destroy_process_group(): on gloo it can hang in the last rank to leave; exiting frees everything.


if __name__ == "__main__":
    main(arguments())
