"""torchrun's main, as the training command runs it for the processes it starts itself (engine/torchrun.py): a Ctrl-C
passed on to it ends it without torchrun's traceback of the signal, after the processes have saved and said how to
continue (`python -m torch.distributed.run` printed 30 lines of it after that line)."""

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException as stopped:
        sys.exit(128 + int(stopped.sigval))  # as a shell counts a process stopped by that signal
