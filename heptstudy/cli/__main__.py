"""``python -m heptstudy.cli ...`` (as torchrun starts ``heptstudy train``): the ``heptstudy`` command."""

import os
import signal
import sys

try:
    from heptstudy.cli import run_command
except KeyboardInterrupt:  # Ctrl-C while the package loads: nothing has started yet
    print("heptstudy: interrupted: nothing had started", file=sys.stderr)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # ended by Ctrl-C, as make and shells expect
    os.kill(os.getpid(), signal.SIGINT)

run_command()
