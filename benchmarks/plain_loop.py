"""The baseline: a hand-written PyTorch loop over the same model, data, batch and optimizer.

python plain_loop.py <package> <epochs> <global batch> [hidden depth]      one process
torchrun --nproc_per_node=2 plain_loop.py ...                              DDP over gloo

Same seed, same generated data, same DataLoader settings, AdamW with the template's
defaults; no logging, no progress bar, no checkpoints: the cheapest loop a user would write.
"""

import importlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from step_timer import Recorder
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def main(package: str, epochs: int, batch_size: int, hidden: int = 128, depth: int = 4) -> None:
    synthetic = importlib.import_module(f"{package}.synthetic")
    model_module = importlib.import_module(f"{package}.model")
    distributed = "RANK" in os.environ
    world, rank = 1, 0
    if distributed:
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()

    torch.manual_seed(42)
    dataset = synthetic.SyntheticData("train", seed=42)
    model = model_module.ResidualMLP(32, 8, hidden=hidden, depth=depth)  # the sizes of configs/data/synthetic.yaml
    sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=42, drop_last=True) if distributed else None
    loader = DataLoader(
        dataset, batch_size=batch_size // world, shuffle=sampler is None, sampler=sampler, drop_last=True
    )
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)

    recorder = Recorder()
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            recorder.batch_start(epoch)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    recorder.save()
    # No destroy_process_group(): on gloo it can hang in the last rank to leave; exiting frees everything.


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
