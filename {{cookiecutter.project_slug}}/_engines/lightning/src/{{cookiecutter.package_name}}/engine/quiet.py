"""Upstream messages known to be harmless, silenced one by one, by exact message and module (never a whole category),
so that a training's console holds what the user needs. What the template itself caused is fixed where it was
caused instead (the wandb logger's arguments, the checkpoints' settings, the test's checkpoint, the metrics' sync).
Imported by engine/__init__.py: every process of a training imports it, spawned ones too."""

import warnings

from ..runtime.quiet_logs import silence_logs

HARMLESS_WARNINGS = [  # (message regex, the module that warns)
    # Lightning 2.6 calls a torch.utils._pytree API that torch 2.10+ deprecates; no effect on what is trained.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
    # A run that continues in its own folder (restart, run_id=...) finds its checkpoints there: by design.
    (r"Checkpoint directory .* exists and is not empty\.", r"lightning\.pytorch\.callbacks\.model_checkpoint"),
    # A training started from another run's checkpoint (ckpt_path=) keeps its own checkpoints and its own best in its
    # own folder: by design.
    (r"The dirpath has changed from", r"lightning\.pytorch\.callbacks\.model_checkpoint"),
    # A checkpoint saved every other number of steps (checkpoint.every_n_steps changed): Lightning keys the checkpoint
    # callback's state by its settings; this run's saves on its own schedule, its best its own (as above).
    (
        r"Be aware that when using `ckpt_path`.* Please add the following callbacks: "
        r"\[\"ResumeCheckpoint\{[^\"]*\"\]\.$",
        r"lightning\.pytorch\.trainer\.call",
    ),
    # Epochs shorter than trainer.log_every_n_steps: the interval counts the run's optimizer steps, over epochs, so
    # train/* is still logged every N steps (as in the Accelerate engine, which says nothing).
    (r"The number of training batches \(\d+\) is smaller than the logging interval", r"lightning\.pytorch\.loops"),
    # strategy=pipeline steps its optimizer by hand (manual optimization); its checkpoint at step N holds the state
    # after N steps, as every other preset's does (which is what resuming needs), not the "pre-optimization" state
    # Lightning's 20-line warning, with example code, offers to save.
    (
        r"Using ModelCheckpoint with manual optimization and every_n_train_steps",
        r"lightning\.pytorch\.callbacks\.model_checkpoint",
    ),
    # On any machine with SLURM installed, a training started without srun (on purpose: the template's sbatch
    # scripts use srun themselves, a run started with python is a local one).
    (
        r"The `srun` command is available on your system but is not used",
        r"lightning\.fabric\.plugins\.environments\.slurm",
    ),
]
# Lightning's advertisement for another logger, and its accelerators' availability (TPU and HPU on every machine;
# the run's devices are in its wandb config, run.*), on every start: logged, not warned. Before a refusal they made
# the one-line error the last of several, as the Accelerate engine's is not. And the fit loop's end, which said
# "`max_epochs=1` reached" before a Ctrl-C's "interrupted after step 14" too. And its echo of trainer.limit_*_batches
# ("`Trainer(limit_val_batches=1)` was configured so 1 batch will be used"), lines before a refusal as well.
SAID_EVERY_START = (
    "`Trainer(limit_",
    "💡 Tip: For seamless cloud logging and experiment tracking",
    "GPU available: ",
    "TPU available: ",
    "HPU available: ",
    "`Trainer.fit` stopped: ",
)


def silence_harmless_messages() -> None:
    for message, module in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, module=module)
    silence_logs({"lightning.pytorch.utilities.rank_zero": SAID_EVERY_START})
