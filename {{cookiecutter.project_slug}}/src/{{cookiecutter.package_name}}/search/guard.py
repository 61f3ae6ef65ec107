"""Runs one trial's training and ends it when the search ends: `python -m <pkg>.search.guard SEARCH_PID COMMAND...`.

The search starts every local trial through this guard. Stopped normally (Ctrl-C, SIGTERM), the search stops its
trials itself; killed (SIGKILL, the OOM killer, a crash), it cannot, and the trials would train on as orphans. The
kernel tells the guard instead (PR_SET_PDEATHSIG, Linux): the guard stops the training and every process under it,
including launcher workers that run in sessions of their own. Written here because neither subprocess nor
torchrun offers it. The guard and the training inherit the study's lock (search.lock), so a search of the same
study cannot start again while any of them still runs.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h
GRACE_SECONDS = 10  # after SIGTERM, what is left of the training is killed


def die_with_parent(search_pid: int) -> None:
    """SIGTERM to this process when its parent ends; and at once if it has ended already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != search_pid:  # the search ended before the line above: nobody would tell us
        os.kill(os.getpid(), signal.SIGTERM)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc (a launcher's workers may have left its process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def main() -> None:
    search_pid, command = int(sys.argv[1]), sys.argv[2:]
    training = subprocess.Popen(command, close_fds=False)  # close_fds=False: the study's lock goes with it

    def stop(signum: int, frame: object) -> None:
        if signum == signal.SIGINT:  # the search stopping the trial: Ctrl-C to the training, which closes its run
            training.send_signal(signal.SIGINT)
            return
        tree = descendants(os.getpid())  # the search is gone: end the whole tree, gently first
        signal_all(tree, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while training.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        signal_all(descendants(os.getpid()) + tree, signal.SIGKILL)
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    die_with_parent(search_pid)
    sys.exit(training.wait())


if __name__ == "__main__":
    main()
