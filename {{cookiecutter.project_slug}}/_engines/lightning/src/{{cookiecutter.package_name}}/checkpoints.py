"""Load a trained model from a checkpoint, without the Trainer, for evaluation or inference."""

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from .module import Classifier


def load_trained(checkpoint: str | Path, config: str | Path | None = None) -> Classifier:
    """The model of a run, with the weights of `checkpoint`, on the CPU and in eval mode.

    The architecture comes from the run's resolved config (`<run dir>/config.yaml`, the default for a
    checkpoint in `<run dir>/checkpoints/`), so a checkpoint of any preset loads on one device.
    """
    checkpoint = Path(checkpoint)
    config = Path(config) if config else checkpoint.parent.parent / "config.yaml"
    model = instantiate(OmegaConf.load(config).model)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict(state)
    return model.eval()
