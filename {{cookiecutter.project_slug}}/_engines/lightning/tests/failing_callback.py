"""A test-only callback that breaks a training on purpose: `+callbacks.fail._target_=failing_callback.FailAtStep`."""

import lightning as L


class FailAtStep(L.Callback):
    def __init__(self, step: int = 3) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"failing on purpose at step {self.step}")
