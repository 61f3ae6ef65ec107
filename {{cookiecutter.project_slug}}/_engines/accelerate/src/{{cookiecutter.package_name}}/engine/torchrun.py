"""`strategy=ddp trainer.devices=N` typed without a launcher, as the Lightning engine takes it: the training command
starts its N processes on this machine under torchrun, as `accelerate launch` would."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from ..errors import EXIT_INTERRUPTED, Interrupted, TrainingStopped
from ..parallel.launcher import PACKAGE, die_with_parent, hydra_quoted, this_job
from ..runtime.interrupt import continuing
from ..runtime.run_folder import HELD_BY_THE_COMMAND

# The presets that run one process per device, started by a launcher (their config's header says which).
LAUNCHED_PRESETS = ("ddp", "fsdp", "model_parallel", "pipeline")


def start_processes(processes: int, run_dir: Path, run_id: str) -> None:
    """`strategy=ddp trainer.devices=N` (fsdp, model_parallel, pipeline too) typed without a launcher: the N
    processes of this machine under torchrun (what `accelerate launch` starts too), each running this job's command
    in this run folder, which this process holds for them; returns when they end. Ctrl-C, or SIGTERM (`kill PID`),
    is passed on as a Ctrl-C: the processes save and stop (Interrupted). Raises TrainingStopped when one failed (its
    error is in the output above). Restarts (torchrun --max-restarts) and several machines: torchrun itself."""
    main = f"{PACKAGE}.engine.torchrun_main"  # torchrun's, without its traceback of the Ctrl-C it is given
    torchrun = [sys.executable, "-m", main, "--standalone", f"--nproc-per-node={processes}"]
    # (after the command's: the last value is taken; quoted: Hydra refuses a bare é, a space)
    here = [f"hydra.run.dir={hydra_quoted(str(run_dir))}", f"run_id={hydra_quoted(run_id)}"]
    env = {**os.environ, HELD_BY_THE_COMMAND: str(run_dir), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's value, set here: it prints a banner when it sets it
    # A session of its own: the terminal's Ctrl-C reaches this process alone, which passes it on once (torchrun given
    # a second one stopped the processes with SIGTERM before they saved). It dies with this process (kill -9).
    command = [*torchrun, "-m", f"{PACKAGE}.train", *this_job(), *here]
    # From where the command was typed (hydra.job.chdir=true moved this process into the run folder): the command
    # line's relative paths (ckpt_path=..., PYTHONPATH=src) mean there what they meant to this process.
    cwd = HydraConfig.get().runtime.cwd
    launcher = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True, preexec_fn=die_with_parent)
    asked: list[int] = []

    def pass_on(signum: int, frame: object) -> None:
        asked.append(signum)
        launcher.send_signal(signal.SIGINT)  # (a second one: the processes stop at once, as a second Ctrl-C does)

    previous = {stop: signal.signal(stop, pass_on) for stop in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = launcher.wait()
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
    if asked or code == EXIT_INTERRUPTED:  # said again last, after torchrun's report of the signal (a second Ctrl-C,
        # or one sent to the processes alone, whose first may be stopped by torchrun before it says it: the only one)
        raise Interrupted(f"interrupted: {continuing(run_id, run_dir)}")
    if code < 0:  # torchrun itself killed (its processes die with it)
        raise TrainingStopped(f"torchrun was stopped by signal {-code}: {continuing(run_id, run_dir)}")
    if code:  # (a worker killed, a bug: once fixed, the run continues from its last checkpoint)
        again = continuing(run_id, run_dir)
        raise TrainingStopped(f"a training process failed (torchrun exit code {code}; its error is above): {again}")
