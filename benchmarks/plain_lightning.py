"""The Lightning baseline: the smallest LightningModule over plain_loop.py's model, data and optimisation.

python plain_lightning.py <package> --epochs E --batch B [--devices 2 ...]   (plain_loop.py's arguments)

The same job as the template's training, in the fewest lines: a LightningDataModule with the training and validation
splits, training_step returning the loss, validation_step (validation after every epoch, as the template does; Lightning
checks for it on every step), configure_optimizers returning the optimizer and the schedule (stepped every step). The
Trainer has no logger, no checkpoints, no progress bar and no model summary; --devices 2 runs Lightning's ddp on gloo
(Lightning starts the second process and adds the distributed samplers). A ratio to it measures what the template
adds to Lightning (its LightningModule's logging, the callbacks, wandb, its data loaders), not Lightning itself.
"""

import lightning as L
import torch.nn.functional as F
from plain_loop import SEED, arguments, parts, split
from step_timer import StepTimer
from torch.utils.data import DataLoader


class PlainModule(L.LightningModule):
    def __init__(self, net, optimisation) -> None:
        super().__init__()
        self.net, self.optimisation = net, optimisation

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        optimizer, scheduler = self.optimisation(self.parameters())
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class PlainData(L.LightningDataModule):
    def __init__(self, train, args) -> None:
        super().__init__()
        self.train, self.args = train, args

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.args.batch // self.args.devices, shuffle=True, drop_last=True)

    def val_dataloader(self):
        return DataLoader(split(self.args, "val"), batch_size=self.args.batch // self.args.devices)


def main() -> None:
    args = arguments()
    L.seed_everything(SEED, verbose=False)
    net, dataset, optimisation = parts(args)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StepTimer()],
    )
    trainer.fit(PlainModule(net, optimisation), datamodule=PlainData(dataset, args))


if __name__ == "__main__":
    main()
