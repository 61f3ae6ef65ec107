"""LightningModules of a user's own, for the trainings the tests start (`+model._target_=own_modules.NAME`; the
tests folder is on their PYTHONPATH)."""

import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.engine.module import Classifier


class SmoothedClassifier(Classifier):
    """The loss changed as docs/your-model.md says, in the module: cross-entropy with label smoothing."""

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, -2), target.flatten(), label_smoothing=0.2)


class Regressor(Classifier):
    """A regression, as docs/your-model.md says: the net's one output per sample against float targets, by MSE."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output.squeeze(-1), target)


class StepLogging(Classifier):
    """A metric of one's own logged from the training step (which strategy=pipeline does not run)."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train/mine", 1.0)
        return loss
