"""A ``checker=python`` check that crashes the process on one candidate.

``check(path)``: the candidate fails while it holds node ``n3`` (the answer a reduce finds); the
candidate whose nodes are exactly ``$CRASH_NODES`` (comma-separated) crashes the process instead
(``$CRASH_HOW``: ``abort`` for ``os.abort()``, ``segv`` for SIGSEGV), or, with ``CRASH_HOW=fail``,
just fails: the run a crash verdict must match.
"""

from __future__ import annotations

import os
import signal

import onnx


def check(path: str) -> bool:
    names = {n.name for n in onnx.load(path, load_external_data=False).graph.node if n.op_type != "Constant"}
    crash = set(filter(None, os.environ.get("CRASH_NODES", "").split(",")))
    if crash and names == crash:
        how = os.environ.get("CRASH_HOW", "abort")
        if how == "abort":
            os.abort()
        if how == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        return False
    return "n3" not in names
