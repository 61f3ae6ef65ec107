"""Start a training command as a fork of a process that has already imported it, instead of a new interpreter.

CI time: a new interpreter spends 2-4 s of CPU importing torch, the engine, Hydra and wandb before a short test
training trains for a second. Here one helper process per test process (the "zygote", this file run as a script)
imports the command's modules once and never computes anything (a process whose torch has started its thread
pools cannot fork safely); each training is a fork of it. The child is a real process of its own (its own pid,
environment, working directory, argv, stdin/stdout/stderr and exit code; killable; it starts the same launchers
and worker processes) and runs the command exactly as `python -m` does (`runpy`, the module as `__main__`, exit
handlers at the end). Only the imports are shared.

Used only where forking is safe: on Linux without CUDA (GPU machines start a new interpreter as before);
`STARTS_NEW_INTERPRETER=1` turns it off everywhere, to compare or to debug.
"""

import atexit
import importlib
import json
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path


def can_fork() -> bool:
    import torch

    linux = sys.platform.startswith("linux")  # macOS's system libraries do not all survive a fork
    return linux and not torch.cuda.is_available() and os.environ.get("STARTS_NEW_INTERPRETER") != "1"


_ZYGOTES: dict[tuple[str, str], subprocess.Popen] = {}


def _zygote(module: str, env: dict[str, str]) -> subprocess.Popen:
    """This test process's helper for `module`, started on first use (with the first training's environment)."""
    key = (module, env.get("PYTHONPATH", ""))
    zygote = _ZYGOTES.get(key)
    if zygote is None or zygote.poll() is not None:
        command = [sys.executable, str(Path(__file__).resolve()), module]
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        zygote = _ZYGOTES[key] = subprocess.Popen(command, env=env, **pipes)
    return zygote


class ForkedCommand:
    """`python -m <module> <args>` forked from the zygote: the subset of subprocess.Popen the tests use (pid,
    poll, wait, returncode, send_signal, kill), stdout and stderr written to `output` (one file, interleaved as a
    terminal shows them)."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], cwd: Path, output: Path):
        self.args = [sys.executable, "-m", module, *args]
        self.output_file = output
        self.returncode: int | None = None
        self._zygote = _zygote(module, env)
        request = {"args": args, "env": env, "cwd": str(cwd), "output": str(output)}
        self._zygote.stdin.write(json.dumps(request) + "\n")
        self.pid = json.loads(self._zygote.stdout.readline())["pid"]

    def poll(self) -> int | None:
        return self._wait_for_exit(0)

    def wait(self, timeout: float | None = None) -> int:
        if self._wait_for_exit(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _wait_for_exit(self, timeout: float | None) -> int | None:
        if self.returncode is None and select.select([self._zygote.stdout], [], [], timeout)[0]:
            line = self._zygote.stdout.readline()
            assert line, "the zygote that forked this training died"
            self.returncode = json.loads(line)["exit"]
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> str:
        return self.output_file.read_text(errors="replace")


def serve(module: str) -> None:
    """The zygote: import `module`'s imports, then fork one child per request line on stdin, answering with its
    pid, then with its exit code once it ends."""
    importlib.import_module(module)
    sys.modules.pop(module, None)  # each child runs it as __main__ alone, as `python -m` does
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_as_main(module, **request)  # never returns
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


def _run_as_main(module: str, args: list[str], env: dict[str, str], cwd: str, output: str) -> None:
    """In the forked child: become `python -m module args` with this environment, then exit with its code."""
    code = 1
    try:
        old = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 - the process's streams, open until exit
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        for name in [None, *logging.root.manager.loggerDict]:  # handlers made at import write to the new streams
            for handler in getattr(logging.getLogger(name), "handlers", []):
                if isinstance(handler, logging.StreamHandler) and handler.stream in old:
                    handler.setStream(sys.stderr if handler.stream in old[1::2] else sys.stdout)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:  # what a new interpreter prints for an uncaught exception, and its exit code
        traceback.print_exc()
        code = 1
    finally:
        try:  # what an interpreter does on its way out: join non-daemon threads, run exit handlers, flush
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            traceback.print_exc()
        os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.path.pop(0)  # this folder, which `python tests/forked.py` put first; the environment's PYTHONPATH says
    serve(sys.argv[1])
