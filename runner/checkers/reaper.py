"""Run a check command so that its whole process group dies with the runner (Linux).

Started as ``python -I -S reaper.py RUNNER_PID COMMAND...`` in a new session: it asks the kernel
for SIGTERM when its parent (the runner) dies (``prctl(PR_SET_PDEATHSIG)``), starts the command
in its own process group, and on that signal (or SIGHUP/SIGTERM/SIGINT from anyone) kills the
group, command and grandchildren included. Otherwise it waits for the command and ends the way
the command ended: the same exit code, or the same signal. Exit code 127 when the program is
not found and 126 when it cannot be executed, as a shell reports them.

Standard library only (it runs with ``-S``, before any site package), so it starts in a few
milliseconds.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from typing import List

PR_SET_PDEATHSIG = 1
ENDING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _end_group(signum: int, frame: object) -> None:
    try:
        os.killpg(0, signal.SIGKILL)  # this process is in the group too
    finally:
        os._exit(128 + signum)


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the runner died before prctl took effect
        _end_group(signal.SIGTERM, None)


def main(argv: List[str]) -> int:
    """Start ``argv[2:]``, wait for it, and return or re-raise how it ended."""
    parent, command = int(argv[1]), argv[2:]
    if os.getpgrp() != os.getpid():  # lead a group of our own, so ending "the group" never reaches the caller
        os.setpgid(0, 0)
    for sig in ENDING:
        signal.signal(sig, _end_group)
    _die_with_parent(parent)
    pid = os.fork()
    if pid == 0:
        for sig in ENDING:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as e:
            os.write(2, f"{command[0]}: {e.strerror}\n".encode(errors="replace"))
            os._exit(127 if e.errno == errno.ENOENT else 126)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # end as the command did, without a core file of our own
        if signum in ENDING:
            signal.signal(signum, signal.SIG_DFL)  # SIGKILL and most others have no handler here
        os.kill(os.getpid(), signum)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
