"""Load a trained net from a checkpoint folder (Accelerator.save_state), without Accelerate, for evaluation."""

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch import nn


def load_trained(checkpoint: str | Path, config: str | Path | None = None) -> nn.Module:
    """The net of a run, with the weights of `checkpoint`, on the CPU and in eval mode.

    The architecture comes from the run's resolved config (`<run dir>/config.yaml`, the default for a
    checkpoint in `<run dir>/checkpoints/`). single, ddp and dp save the net as model.safetensors; model_parallel
    and pipeline save it, gathered from the shards or stages, in their own state file (see their `WholeState`
    and `StagesState`). Either way it loads on one device.
    """
    checkpoint = Path(checkpoint)
    config = Path(config) if config else checkpoint.parent.parent / "config.yaml"
    net = instantiate(OmegaConf.load(config).model.net)
    if (checkpoint / "model.safetensors").is_file():
        state = load_file(checkpoint / "model.safetensors")
    else:  # custom_checkpoint_0 is the loop's progress; the strategy's state comes next
        state = torch.load(checkpoint / "custom_checkpoint_1.pkl", map_location="cpu", weights_only=False)["model"]
    net.load_state_dict(state)
    return net.eval()
