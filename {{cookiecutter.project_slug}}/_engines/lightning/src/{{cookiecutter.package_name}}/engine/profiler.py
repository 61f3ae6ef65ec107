"""trainer.profiler=null (the default): no profiling, and nothing paid for it on every hook."""

from contextlib import nullcontext

from lightning.pytorch.profilers import PassThroughProfiler

NOTHING = nullcontext()  # reusable: it keeps no state


class NoProfiler(PassThroughProfiler):
    """Lightning's PassThroughProfiler (what the Trainer uses without a profiler), with a cheaper `profile()`.

    Lightning wraps every call of a hook (each callback's, the LightningModule's, the strategy's: dozens per training
    step) in `with trainer.profiler.profile(name)`. PassThroughProfiler inherits a generator-based context manager,
    about ten Python calls each time, a few percent of a small step in all. This one returns a shared do-nothing
    context. trainer.profiler=simple|advanced|pytorch use Lightning's profilers instead.
    """

    def profile(self, action_name: str) -> nullcontext:
        return NOTHING
