"""`strategy=ddp trainer.devices=N` typed without a launcher, as the Lightning engine takes it: the training command
starts its N processes on this machine under torchrun, as `accelerate launch` would."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..errors import Interrupted, TrainingStopped
from ..parallel.launcher import PACKAGE
from ..runtime.run_folder import HELD_BY_THE_COMMAND

# The presets that run one process per device, started by a launcher (their config's header says which).
LAUNCHED_PRESETS = ("ddp", "fsdp", "model_parallel", "pipeline")


def start_processes(processes: int, run_dir: Path, run_id: str, overrides: list[str]) -> None:
    """`strategy=ddp trainer.devices=N` (fsdp, model_parallel, pipeline too) typed without a launcher: the N
    processes of this machine under torchrun (what `accelerate launch` starts too), each running this command
    (`overrides`: its job's, one job of a --multirun) in this run folder, which this process holds for them; returns
    when they end. Raises TrainingStopped when one failed (its
    error is in the output above). Restarts (torchrun --max-restarts) and several machines: torchrun itself."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    here = [f"hydra.run.dir={run_dir}", f"run_id={run_id}"]  # (after the command's: the last value is taken)
    env = {**os.environ, HELD_BY_THE_COMMAND: str(run_dir), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's value, set here: it prints a banner when it sets it
    launcher = subprocess.Popen([*torchrun, "-m", f"{PACKAGE}.train", *overrides, *here], env=env)
    asked: list[int] = []  # Ctrl-C: torchrun passes it on (the terminal's reaches it too); the processes save, stop

    def pass_on(signum: int, frame: object) -> None:
        asked.append(signum)
        launcher.send_signal(signum)

    previous = signal.signal(signal.SIGINT, pass_on)
    try:
        code = launcher.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    if asked:  # the first process said how to continue (torchrun's own report of the signal follows it)
        raise Interrupted("")
    if code:
        raise TrainingStopped(f"a training process failed (torchrun exit code {code}; its error is above)")
