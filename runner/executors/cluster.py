"""``python -m runner.executors.cluster SPEC``: the process that hosts ``executor=processes``'s Dask cluster.

The runner starts it (``runner.executors.processes``) so that Dask's scheduler and its nannies
live outside the runner's own process: in it they shared the interpreter with the checks run
there and made a 3-second reduce on an H100 2 seconds slower, with workers that never touched
the GPU. It starts a ``SpecCluster`` (Dask's own), one ``Nanny`` and worker process per entry
of SPEC, each with its own environment (``CUDA_VISIBLE_DEVICES`` set before it imports ONNX
Runtime), warms every worker (``warm``: its imports; the runner warms its GPU once it connects,
``warm_cuda``), prints the scheduler's address on one line and waits.

It ends, with every worker process, when its standard input closes: the runner closes it at
its end, and the system does when the runner dies. The runner started it as the leader of a
process group of its own, so the runner can also stop the whole group at once.

SPEC is JSON: ``{"names": [str], "env": [{str: str}], "nthreads": int, "timeout_s": float, "log": bool}``
(``nthreads``: checks at once in each worker process, 1 when absent).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import Any, Dict, List, TextIO

log = logging.getLogger(__name__)


def serve(spec: Dict[str, Any], out: TextIO) -> None:
    """Start the cluster SPEC describes, write the scheduler's address on one line to ``out`` once
    every worker is warm, and wait until standard input closes.

    Raises:
        TimeoutError: the workers did not all start within ``spec["timeout_s"]`` seconds.
        Whatever Dask raises when a worker cannot start (the runner reports it in one line).
    """
    import distributed

    names: List[str] = spec["names"]
    quiet = logging.DEBUG if spec.get("log") else logging.CRITICAL
    workers = {
        name: {
            "cls": distributed.Nanny,
            "options": {
                "nthreads": int(spec.get("nthreads", 1)),
                "memory_limit": 0,  # the checks' memory is theirs: no spilling or pausing by Dask
                "env": env,
                "silence_logs": quiet,  # a worker's lost heartbeat at close is no news
                "dashboard": False,
            },
        }
        for name, env in zip(names, spec["env"])
    }
    # allowed_failures=0: a check that kills its worker is not run again on the restarted one
    scheduler = {
        "cls": distributed.Scheduler,
        "options": {
            "dashboard": False,
            "dashboard_address": "127.0.0.1:0",  # never 8787, which another cluster may hold
            "allowed_failures": 0,
            "host": "127.0.0.1",
        },
    }
    threading.Thread(target=_end_with_input, name="end-with-input", daemon=True).start()
    cluster = distributed.SpecCluster(workers=workers, scheduler=scheduler, silence_logs=quiet)
    client = distributed.Client(cluster, set_as_default=False)
    client.wait_for_workers(len(names), timeout=float(spec["timeout_s"]))
    client.run(warm)
    client.close()
    print(cluster.scheduler_address, file=out, flush=True)
    out.close()
    threading.Event().wait()


def _end_with_input() -> None:
    """Read standard input to its end (the runner closed it, or died), then stop this process
    group: this process, its nannies' worker processes and anything a check left running."""
    sys.stdin.buffer.read()
    if os.getpgid(0) == os.getpid():  # the leader of its own group, as the runner starts it
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def warm() -> None:
    """Make a worker process ready before its first check: import what a check needs (ONNX
    Runtime, the checkers). Its GPU is left alone until the runner connects (``warm_cuda``): a
    run that ends in the runner never has the workers contend with it for the GPU."""
    import onnxruntime  # noqa: F401

    import runner.checkers.compare
    import runner.executors.base  # noqa: F401


def warm_cuda() -> None:
    """In a worker pinned to a GPU, create the CUDA context and cuDNN's handles with a one-Conv
    session on ONNX Runtime's CUDA provider (the second or so every new process pays once); the
    runner runs it on every worker when it connects. Elsewhere, nothing."""
    import onnxruntime as ort

    if not os.environ.get("CUDA_VISIBLE_DEVICES") or "CUDAExecutionProvider" not in ort.get_available_providers():
        return
    import numpy as np

    try:
        session = ort.InferenceSession(warm_model().SerializeToString(), providers=["CUDAExecutionProvider"])
        session.run(None, {"x": np.zeros((1, 1, 4, 4), np.float32)})
    except Exception as e:  # the first check will say what is wrong with the GPU, if anything is
        log.warning("Warming CUDA in a worker failed (its first check pays for it): %s", str(e).strip()[:200])


def warm_model() -> Any:
    """The one-Conv model ``warm_cuda`` runs: opset 13 at IR version 7, which every ONNX Runtime since 1.6
    loads (``make_model``'s default is the installed onnx's own IR version: onnx 1.20 writes 14, which
    ONNX Runtime 1.31 refuses, and the warm-up failed unseen on the GPU machines)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "warm", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def main(argv: List[str]) -> int:
    """Entry point: ``argv[1]`` is the JSON SPEC. The one line the runner reads comes on standard
    output: the scheduler's address, or ``error: TYPE: MESSAGE`` (then it returns 1); it does not
    return otherwise. Everything else this process and its workers write to standard output goes
    to standard error (the runner's): a pipe nobody reads would stop them once full."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    spec = json.loads(argv[1])
    if not spec.get("log"):
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
    try:
        serve(spec, out)
    except BaseException as e:  # the runner shows this line in its error
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"error: {type(e).__name__}: {first}", file=out, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
