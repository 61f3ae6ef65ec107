"""The GPU baseline: a hand-written loop training the template's GPT on one GPU, the way a user who knows the tricks
writes it: bf16 autocast, fused AdamW, torch.compile, TF32, batches from a DataLoader over the same generated tokens
with page-locked memory and non-blocking copies. No logging, no checkpoints, no validation.

    python benchmarks/gpu_loop.py <package> --dim 1024 --depth 24 --heads 16 --seq 1024 --vocab 32768 --batch 16

Prints one JSON line: step_ms (the mean over the timed steps: the window's two ends wait for the GPU, the steps
between do not, as in a training and the template's bench), tokens_per_s,
parameters and mfu (6 x parameters x tokens/s over --peak-tflops: the dense-network estimate the template's bench
uses). --float8 tensorwise|rowwise converts the blocks' Linear layers as the template does (models/float8.py);
--cpu runs it on the CPU, small, without bf16 (a dry run of the script, no figure to report).
"""

import argparse
import functools
import importlib
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", help="the baked project's package (on PYTHONPATH)")
    for name, default in [("dim", 1024), ("depth", 24), ("heads", 16), ("seq", 1024), ("vocab", 32768), ("batch", 16)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed (the first one compiles)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--float8", default="none")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="one GPU's dense bf16 peak (H100 SXM, H200)")
    parser.add_argument("--cpu", action="store_true")
    return parser.parse_args()


def main(args: argparse.Namespace) -> None:
    gpt = importlib.import_module(f"{args.package}.models.gpt")
    tokens = importlib.import_module(f"{args.package}.data.tokens")
    float8 = importlib.import_module(f"{args.package}.models.float8")
    device = torch.device("cpu" if args.cpu else "cuda")
    torch.manual_seed(42)
    torch.backends.cuda.matmul.allow_tf32 = True
    steps = args.warmup + args.steps
    data = tokens.TokenData("train", vocab_size=args.vocab, seq_len=args.seq, train_size=args.batch * (steps + 1))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True, pin_memory=not args.cpu)
    net = gpt.GPT(args.vocab, args.seq, dim=args.dim, depth=args.depth, num_heads=args.heads)
    parameters = sum(p.numel() for p in net.parameters())  # the tied head counted once, as the bench does
    float8.convert_float8(net, args.float8)
    net.to(device)
    if not args.no_compile:
        net.compile()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
    autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16, enabled=not args.cpu)
    ends = []  # the timed window's two ends, each after the GPU's queued work (the steps between do not wait)
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            loss = F.cross_entropy(net(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step in (args.warmup - 1, steps - 1):  # the end of the last warm-up step starts the clock
            if not args.cpu:
                torch.cuda.synchronize()
            ends.append(time.perf_counter())
    seconds = (ends[-1] - ends[0]) / args.steps
    tokens_per_s = args.batch * args.seq / seconds
    mfu = 6 * parameters * tokens_per_s / (args.peak_tflops * 1e12)
    print(json.dumps({"step_ms": seconds * 1e3, "tokens_per_s": tokens_per_s, "parameters": parameters, "mfu": mfu}))


if __name__ == "__main__":
    main(arguments())
