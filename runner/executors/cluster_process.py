"""The runner's handle on the process that hosts ``executor=processes``'s Dask cluster.

``ClusterProcess`` starts ``python -m runner.executors.cluster SPEC`` as the leader of a process
group of its own, reads the one line it prints (the scheduler's address once every worker is
warm, or ``error: ...``) within a time limit, and stops the whole group (the process, its
nannies, every worker process and anything a check left running) when asked or when the time
runs out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional


class ClusterStartError(Exception):
    """The cluster's process ended without an address; the message is its reason."""


class ClusterProcess:
    """One cluster process, started by ``address`` and stopped by ``stop``; both may be called from
    different threads (``stop`` during ``address`` ends the wait).

    Args:
        spec: the cluster's SPEC (``runner.executors.cluster``), sent as JSON on its command line.
    """

    def __init__(self, spec: Dict[str, Any]):
        self.spec = spec
        self.process: Optional[subprocess.Popen] = None
        self.timed_out = False
        self._stopped = False
        self._lock = threading.Lock()

    def address(self, timeout_s: float) -> Optional[str]:
        """Start the process and wait for the scheduler's address it prints once every worker is warm.

        Args:
            timeout_s: seconds the workers get to start and warm; then the group is stopped.

        Returns:
            The address (``tcp://HOST:PORT``), or None when ``stop`` came first.

        Raises:
            TimeoutError: the workers were not ready within ``timeout_s``.
            ClusterStartError: the process ended first (its ``error:`` line, or its exit code).
        """
        with self._lock:
            if self._stopped:
                return None
            self.process = subprocess.Popen(
                [sys.executable, "-m", "runner.executors.cluster", json.dumps(self.spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,  # the workers' warnings and a python check's prints reach the user as with threads
                start_new_session=True,  # its own process group: stop() ends every worker with it
                text=True,
                # the workers import what this process can (a python check, a data loader): its sys.path
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)},
            )
        timer = threading.Timer(timeout_s, self._time_out)
        timer.start()
        try:
            line = self.process.stdout.readline().strip() if self.process.stdout else ""
        finally:
            timer.cancel()
        if line.startswith("tcp://"):
            return line
        if self._stopped and not self.timed_out:
            return None
        self.process.wait()
        if self.timed_out:
            raise TimeoutError(f"no worker ready within {timeout_s:g} s")
        raise ClusterStartError(
            line.removeprefix("error: ") or f"the cluster's process ended with exit code {self.process.returncode}"
        )

    def _time_out(self) -> None:
        self.timed_out = True
        self.stop()

    def stop(self) -> None:
        """Stop the process group and wait (up to 10 s) until none of its processes runs: SIGKILL
        lands asynchronously. The group is stopped even when its leader has ended (a cluster
        process that died leaves its nannies and workers in the group). Before ``address``
        started it: it never starts."""
        with self._lock:
            self._stopped = True
            process = self.process
        if process is None:
            return
        # a group id is not given to a new process while a member of the group lives
        if process.poll() is None or group_running(process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 10.0
        while group_running(process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)


def group_running(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (a zombie does not count), read from Linux's
    ``/proc/<pid>/stat``; False where there is no ``/proc``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # after "pid (comm)" come: state, ppid, pgrp, ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
