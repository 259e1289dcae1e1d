"""Exec a command that dies with the process that started it.

``python -m runtime.die_with_parent PARENT_PID CMD ARGS...`` asks Linux to SIGKILL this
process when its parent exits (PR_SET_PDEATHSIG survives exec), checks the parent is
still the one named (it may have died already), then execs the command. The cluster
launcher starts every child this way instead of with ``preexec_fn``, which runs Python
in a forked copy of a process whose gRPC threads and file descriptors do not survive
the fork.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the launcher's close() still stops its children
        pass
    if os.getppid() != parent:
        sys.exit(1)  # the parent died before we could ask
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
