"""Check functions for ``checker=python`` in tests: in-process, so a mode test pays no interpreter start-up
per check."""

from __future__ import annotations

import time

import onnx


def lacks_nodes(path: str, *names: str) -> bool:
    """Passes (True) unless the model holds every node named: a stand-in for a backend bug in those nodes."""
    held = {n.name for n in onnx.load(path, load_external_data=False).graph.node}
    return not all(name in held for name in names)


def lacks_nodes_slowly(path: str, seconds: str, *names: str) -> bool:
    """``lacks_nodes`` after sleeping ``seconds``: a check that takes a while, as real ones do."""
    time.sleep(float(seconds))
    return lacks_nodes(path, *names)


def python_check(*names: str) -> list:
    """The overrides for ``checker=python`` running ``lacks_nodes`` with ``names``."""
    return ["checker=python", "checker.target=tests.helpers.checks.lacks_nodes", f"checker.args=[{','.join(names)}]"]


def reduce_args(model, *culprits: str, script=None) -> list:
    """A reduce whose check fails while the model holds the culprits: the command ``script``, else in-process."""
    from tests.helpers.cli import check_cmd

    check = [check_cmd(script, "{artifact}", *culprits)] if script else python_check(*culprits)
    return ["mode=reduce", f"model={model}", *check]


def dies(path: str) -> bool:
    """A check that kills the process running it, as a crash in a backend does."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return True


def raises_without(path: str, guard: str, *names: str) -> bool:
    """``lacks_nodes(names)``, but raises when the model lacks node ``guard``: a check with a bug of its own."""
    held = {n.name for n in onnx.load(path, load_external_data=False).graph.node}
    if guard not in held:
        raise KeyError(f"no node {guard}")
    return not all(name in held for name in names)


def exits(path: str, code: str) -> bool:
    """A check that calls ``sys.exit(code)`` instead of returning a verdict."""
    import sys

    sys.exit(int(code))


def hangs(path: str, pidfile: str) -> bool:
    """A check that writes its process id to ``pidfile`` and never returns (a hang in a backend)."""
    import os

    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
    return True


def compute_names(path) -> list:
    """The names of the model file's nodes, Constant nodes aside."""
    return [n.name for n in onnx.load(str(path)).graph.node if n.op_type != "Constant"]


def reduce_run(run, model_path, culprits, *extra, out=None, script=None):
    """Reduce with a check that fails while the model holds every culprit: in-process (checker=python),
    or the command ``script`` when given."""
    out = out or model_path.parent / "reduced.onnx"
    r = run(*reduce_args(model_path, *culprits, script=script), f"output={out}", *extra)
    assert r.returncode == 0, r.stderr + r.stdout[-3000:]
    onnx.checker.check_model(str(out))
    return r, out


def has_no_cast(path: str) -> bool:
    """Passes only while the model holds no ``Cast`` node: the model as given, and the candidate with every node
    kept (it is the model as given, node for node), but no candidate with a node in fp16."""
    return all(n.op_type != "Cast" for n in onnx.load(path, load_external_data=False).graph.node)


def declares_no_tensor_types(path: str) -> bool:
    """Passes only while the model declares no intermediate tensor's type (``value_info``), as the model as given
    does: every candidate the pipeline builds declares them (from its shape inference), so the pipeline itself
    flips this deterministic check whatever the search keeps (as a converted graph's NMS flips an SSD's box)."""
    return not onnx.load(path, load_external_data=False).graph.value_info


def returns(path: str, what: str) -> object:
    """A check that returns something other than a bool: the string "False", "no", a generator, a function."""
    return {"False": "False", "no": "no", "generator": (x for x in [False]), "function": len}[what]


def reads_no_dq(path: str, *names: str) -> bool:
    """Passes only while none of the nodes ``names`` reads a DequantizeLinear's output (they are kept out of
    int8/fp8): a check whose answer is ``names``, whatever the numbers."""
    model = onnx.load(path, load_external_data=False)
    made = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return not any(made & set(n.input) for n in model.graph.node if n.name in names)
