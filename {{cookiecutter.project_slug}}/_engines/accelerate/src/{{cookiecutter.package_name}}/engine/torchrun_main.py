"""torchrun's main, as the training command runs it for the processes it starts itself (engine/torchrun.py): a Ctrl-C
passed on to it ends it without torchrun's traceback of the signal, after the processes have saved and said how to
continue (`python -m torch.distributed.run` printed 30 lines of it after that line); so does a Ctrl-C sent to the
processes alone."""

import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main

from ..errors import EXIT_INTERRUPTED

if __name__ == "__main__":
    try:
        main()
    except SignalException as stopped:
        sys.exit(128 + int(stopped.sigval))  # as a shell counts a process stopped by that signal
    except ChildFailedError as failed:  # the processes interrupted (a Ctrl-C sent to them, not to the command): they
        codes = {failure.exitcode for failure in failed.failures.values()}  # saved; torchrun stops the ones that
        if EXIT_INTERRUPTED in codes and codes <= {EXIT_INTERRUPTED, -signal.SIGTERM}:  # had not ended yet (SIGTERM)
            sys.exit(EXIT_INTERRUPTED)  # the command says how to continue; torchrun's 30-line report said no more
        raise
