"""What the launcher says: who started this process (torchrun, SLURM or nothing), the layout of the processes it
started, and the run id they share, so that every rank, node and restart of one training uses one run folder."""

import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from omegaconf import OmegaConf

from .. import IMPORTED_IN, STARTED_BY
from ..errors import ConfigError, srun_tasks
from .presets import STRATEGY_CONFIGS

PACKAGE = "{{ cookiecutter.package_name }}"
# torchrun's arguments on each node of a multi-node training (the same --rdzv-id on every node: one run folder)
MULTI_NODE_ARGS = ["--rdzv-backend=c10d", "--rdzv-endpoint=$HEAD_NODE:29500", "--rdzv-id=$JOB_ID"]


def multi_node_torchrun(nodes: int, devices: int) -> list[str]:
    """The torchrun that starts `devices` processes on each of `nodes` machines: the same line on each."""
    return ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={devices}", *MULTI_NODE_ARGS]


def module_command(module: str, preset: str) -> list[str]:
    """`-m <package>.<module> strategy=<preset>`: the command a launcher or python runs."""
    return ["-m", f"{PACKAGE}.{module}", f"strategy={preset}"]


# Presets that start their processes themselves from one process on one machine; a launcher cannot run them.
SINGLE_MACHINE_PRESETS = {
    "dp": "strategy=dp runs one process on one node (one thread per GPU)",
    "ddp_spawn": "strategy=ddp_spawn starts its own processes, from one process on one node",
}


@dataclass(frozen=True)
class Launcher:
    """The processes a launcher started for this training, all nodes together."""

    name: str  # "torchrun", "accelerate launch" (which runs torch's elastic agent) or "SLURM"
    world_size: int  # processes in all
    num_nodes: int
    per_node: int  # processes per node


def is_first_process() -> bool:
    """Rank 0 of the launch, as the launchers' variables say (usable before any process group exists)."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"))


def detect_launcher() -> Launcher | None:
    """The launcher that started this process and its siblings; None for a plain `python -m ...`.

    torchrun (torch.distributed.elastic) sets WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_WORLD_SIZE (its agents, one
    per node) for every worker. srun sets SLURM_STEP_NUM_TASKS/SLURM_STEP_NUM_NODES for its tasks (one task per
    process: Lightning's convention). torchrun inside a SLURM job wins: it started the processes.
    """
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env and "LOCAL_WORLD_SIZE" in env:
        world, per_node = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
        name = "accelerate launch" if "ACCELERATE_MIXED_PRECISION" in env else "torchrun"  # (accelerate's: torchrun's)
        return Launcher(name, world, int(env.get("GROUP_WORLD_SIZE", world // per_node)), per_node)
    if "SLURM_STEP_NUM_TASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        world, nodes = int(env["SLURM_STEP_NUM_TASKS"]), int(env.get("SLURM_STEP_NUM_NODES", 1))
        if world > 1:
            return Launcher("SLURM", world, nodes, world // nodes)
    return None


def fit_layout_to_launcher(
    preset: str, num_nodes: int, devices: int | str, overrides: Iterable[str]
) -> tuple[int, int | str]:
    """(num_nodes, devices) for this run: the launcher's layout, unless the command line gave them.

    Given on the command line (`overrides`, e.g. Hydra's task overrides) and contradicting the launcher, they are
    refused in one line naming both numbers. Presets that cannot run under a launcher or over nodes are refused too.
    """
    launcher = detect_launcher()
    if preset in SINGLE_MACHINE_PRESETS and (num_nodes > 1 or (launcher and launcher.world_size > 1)):
        where = f"under {launcher.name}" if launcher else f"on trainer.num_nodes={num_nodes}"
        raise ConfigError(f"{SINGLE_MACHINE_PRESETS[preset]}, so not {where}; use strategy=ddp")
    stray = [
        f"{name}={os.environ[name]}"
        for name, alone in (("WORLD_SIZE", "1"), ("RANK", "0"))
        if os.environ.get(name, alone) != alone
    ]
    if launcher is None and preset == "single" and stray:  # (Lightning's logging went quiet: "not rank 0")
        raise ConfigError(
            f"strategy=single runs one process, but {' '.join(stray)} is set and no launcher (torchrun, accelerate "
            f"launch, srun) started this one: unset {', '.join(item.partition('=')[0] for item in stray)} (left from "
            "another job?); for several processes, strategy=ddp trainer.devices=N without them"
        )
    if launcher is None and "RANK" in os.environ and stray and "KUBERNETES_SERVICE_HOST" not in os.environ:
        # Left from another job in this shell: the processes waited for ever for the others of that job's layout
        # (Lightning's own processes get no RANK; Kubernetes' PyTorchJob sets it for a pod's one process)
        left = [
            name for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name in os.environ
        ]
        raise ConfigError(
            f"{' '.join(stray)} is set, but no launcher (torchrun, accelerate launch, srun) started this process: "
            f"left from another job? unset {' '.join(left)} (a launcher sets them for the processes it starts)"
        )
    if launcher is None and num_nodes > 1 and preset != "single":  # (Lightning waited for the other nodes for ever)
        raise ConfigError(
            f"trainer.num_nodes={num_nodes}: this command starts the processes of one machine; for several, start "
            "torchrun on each (launch/torchrun_multinode.sh, docs/many-machines.md), or sbatch launch/slurm.sbatch"
        )
    if launcher is None:
        return num_nodes, devices
    given = {override.lstrip("+").partition("=")[0] for override in overrides}
    nodes_given = "trainer.num_nodes" in given
    devices_given = "trainer.devices" in given and devices not in ("auto", -1)
    configured = devices  # a preset's or recipe's count (trainer.devices: 4 in a copy of ddp.yaml), else 1 or auto
    num_nodes = num_nodes if nodes_given else launcher.num_nodes
    devices = devices if devices_given else launcher.per_node
    if (nodes_given or devices_given) and int(num_nodes) * int(devices) != launcher.world_size:
        raise ConfigError(
            f"trainer.num_nodes={num_nodes} x trainer.devices={devices} = {int(num_nodes) * int(devices)} process"
            f"{'es' * (int(num_nodes) * int(devices) != 1)}, "
            f"but {launcher.name} runs {launcher.world_size} ({launcher.num_nodes} node"
            f"{'s' * (launcher.num_nodes != 1)} x {launcher.per_node}); leave both out to use the launcher's layout"
        )
    if configured != devices and configured != shipped_devices(preset) and is_first_process():  # (yours only)
        print(
            f"note: trainer.devices={configured} (from the config) gives way to the {devices} processes per node "
            f"{launcher.name} started; it counts the processes of a command that starts them itself (python -m)",
            file=sys.stderr,
        )
    return num_nodes, devices


def shipped_devices(preset: str) -> object:
    """The trainer.devices the project's own file of `preset` gives (Lightning's pipeline.yaml: 2), else the
    trainer's default (1)."""
    path = STRATEGY_CONFIGS / f"{preset}.yaml"
    return OmegaConf.select(OmegaConf.load(path), "trainer.devices", default=1) if path.is_file() else 1


# What a preset of several processes does in one (said: on a CPU, devices=auto means one)
ONE_PROCESS = {"fsdp": "nothing is sharded (strategy.offload=true still moves the weights to host memory)"}


def one_process_note(preset: str, layout: str = "") -> str:
    """The note for `preset` run as one process (`layout`: how the engine counted it, e.g. devices x nodes), with how
    to start more: its launcher's way, else trainer.devices."""
    does = ONE_PROCESS.get(preset, "it trains as strategy=single does")
    more = started_alone() or "for N processes pass trainer.devices=N"
    return f"note: strategy={preset} runs 1 process here{layout}: {does}; {more}"


def started_alone() -> str | None:
    """How to have this process's launcher start N processes, said to the one process of a preset of several that
    a launcher started; None for a command started by hand (its engine says how it starts them itself)."""
    env = os.environ
    if "SLURM_JOB_ID" in env and "TORCHELASTIC_RUN_ID" in env:  # launch/slurm.sbatch: torchrun on each machine
        return "SLURM gave it 1 per machine: give sbatch --ntasks-per-node=N (launch/slurm.sbatch starts N)"
    if "TORCHELASTIC_RUN_ID" in env and "ACCELERATE_MIXED_PRECISION" in env:
        return "accelerate launch started 1: give it --num_processes N"
    if "TORCHELASTIC_RUN_ID" in env and env.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return (  # (torchrun does not say how many machines the group had before: its size now is all it tells)
            "torchrun restarted it as 1 (all that is left of an elastic --nnodes=MIN:MAX job when the other "
            "machines left; otherwise give torchrun --nproc-per-node=N)"
        )
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun started 1: give it --nproc-per-node=N (NPROC_PER_NODE=N for launch/torchrun_multinode.sh)"
    if "ACCELERATE_MIXED_PRECISION" in env:  # accelerate's launcher ran the command itself: one process
        return (
            "accelerate launch started 1 (it does with --cpu or a config's use_cpu: true, or without a config on a "
            "machine of fewer than 2 GPUs): launch it with `accelerate launch --config_file launch/multi_process.yaml "
            "...`, or give trainer.devices=N (the command then starts them)"
        )
    return None


# gloo's words when the process at the other end of a collective is gone (killed, crashed): the survivors' own error
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def lost_peer(error: BaseException) -> str | None:
    """gloo's words, where `error` (or one it came from) is this process's collective failing because another
    process of the training died: that one's output says why; this one's 40-line traceback said nothing more."""
    seen = error
    while seen is not None:
        if found := next((words for words in PEER_GONE if words in str(seen)), None):
            return found
        seen = seen.__cause__ or seen.__context__
    return None


def check_srun_tasks_joined(joined: bool) -> None:
    """Refuse srun's tasks that do not join one training (`joined`: the engine's process group spans them): each
    trained alone, as many copies as tasks in one run folder (every metric row twice, a wandb run each, the same
    checkpoint files written by each)."""
    if (tasks := srun_tasks()) > 1 and not joined:
        raise ConfigError(
            f"srun started {tasks} tasks that do not join one training: each would train alone, {tasks} copies in one "
            "run folder; run launch/slurm.sbatch, which joins them, or start one task (srun -n1)"
        )


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_launcher() -> None:
    """Under torchrun (accelerate launch too), stop this process when its agent dies (kill -9 of a node's torchrun,
    the node's job step ended): torch's agent starts its workers in sessions of their own and does not ask the
    kernel to, so they trained on as orphans, writing checkpoints and metrics the restarted run then disagreed
    with. SIGKILL: Lightning answers SIGTERM by finishing its step, and a worker paused in a collective would wait
    on. Linux (prctl); elsewhere nothing changes."""
    launcher = detect_launcher()
    if launcher is None or launcher.name == "SLURM" or not sys.platform.startswith("linux"):
        return
    # (a process forked from the one that imported the package, as a pre-loading launcher does, asks now)
    agent = STARTED_BY if IMPORTED_IN == os.getpid() else os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # The agent died before the line above, maybe while this process imported the package (kill -9 of torchrun's
    # process group, which does not reach its workers' sessions): nobody would tell it. (torchrun may be PID 1.)
    if os.getppid() != agent:
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent() -> None:
    """In a process about to run another program (a subprocess's preexec_fn): SIGKILL it when the process that
    started it dies (kill -9 of a command that started torchrun: torchrun and its workers trained on), and with it
    its workers (die_with_launcher), at once, as kill -9 of any training stops it. (With SIGTERM torchrun passed it
    on, and its processes trained on a step or more.) Linux."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def warn_if_restarts_can_hang() -> None:
    """Say so (rank 0, one line) when torchrun will restart its workers through the store it shares with them.

    torchrun's agent hosts the TCPStore its workers meet in and, by default, hands every restart the same store,
    keys of the dead workers included (torch 2.13: torch.distributed.rendezvous assumes a new store per restart).
    A restarted worker can then read a dead one's address: "Connection refused", then a hang; measured with a
    plain gloo script, 3 restarts in 6 failed. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment
    makes each restart meet in a new store (8 of 8 and 6 of 6 restarted); launch/*.sh and *.sbatch set it.
    """
    env = os.environ
    restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and restarts > 0 and env.get("RANK", "0") == "0":
        print(
            f"warning: torchrun --max-restarts={restarts} with its shared store: restarted processes may hang; "
            "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun (launch/torchrun_multinode.sh does)",
            file=sys.stderr,
        )


def default_run_id() -> str:
    """The id of this training when `run_id=` is not given; every process of the launch agrees on it.

    A SLURM job keeps its id when requeued, and torchrun keeps its rendezvous id (--rdzv-id; a random one without
    it, or with --standalone) across restarts: the training's folder, hence its checkpoints, survive both. Otherwise
    a timestamp: under a launcher without an id (accelerate launch, TORCHELASTIC_RUN_ID=none) the processes are
    named after the moment their launcher, the parent of all of them on this machine, started, which is the same on
    every one of them and across restarts. That cannot work across machines: check_run_id refuses several nodes
    without an id. Without a launcher, the moment this process started: Lightning's own launcher resolves the run
    folder again when it starts the other processes (at the time of that call, it named a second, empty, folder).
    """
    env = os.environ
    if "SLURM_JOB_ID" in env:
        if "SLURM_ARRAY_TASK_ID" in env:  # an array task: named after the array, like SLURM's own 123_4
            return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
        return env["SLURM_JOB_ID"]
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return run_id
    started = start_time(os.getppid() if detect_launcher() else os.getpid())
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(started))


def check_run_id(overrides: Iterable[str]) -> None:
    """Refuse a multi-node launch that has no id for its run folder (each node would name its own)."""
    given = {override.lstrip("+").partition("=")[0] for override in overrides}
    env, launcher = os.environ, detect_launcher()
    has_id = "SLURM_JOB_ID" in env or os.environ.get("TORCHELASTIC_RUN_ID", "none") != "none"
    if launcher and launcher.num_nodes > 1 and not has_id and not given & {"run_id", "hydra.run.dir"}:
        raise ConfigError(
            f"{launcher.name} started {launcher.num_nodes} nodes without a run id, so each would write its own run "
            "folder: give run_id=NAME" + (" (or torchrun --rdzv-id=NAME)" if launcher.name == "torchrun" else "")
        )


def start_time(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch (Linux /proc); None elsewhere (then: now)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks after boot
        with open("/proc/stat") as stat:
            boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A free TCP port on this machine for a rendezvous, so that concurrent multi-process trainings do not collide."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def this_job() -> list[str]:
    """This job's command line, for the other processes a training command starts: as typed (with --config-dir,
    --config-name and hydra.* overrides), or, one job of a --multirun, its own overrides and the config it was
    composed from (the whole command line would run the whole sweep in each of them)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra = HydraConfig.get()
    if hydra.mode == RunMode.RUN:
        return sys.argv[1:]
    folders = [source.path for source in hydra.runtime.config_sources if source.provider == "command-line"]
    where = [f"--config-dir={folder.removeprefix('file://')}" for folder in folders]
    return [*where, f"--config-name={hydra.job.config_name}", *hydra.overrides.task]


def hydra_quoted(value: str) -> str:
    """`value` as a quoted string of Hydra's override grammar, which takes any character there (an é, a space): for
    the command lines of the processes a training starts."""
    return '"' + value.replace('"', '\\"') + '"'
