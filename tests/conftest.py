"""Shared fixtures: real models from ../shared/models, small graphs, and a CLI runner."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("RUNNER_SHARED_MODELS", ROOT.parent / "shared" / "models"))
DETECTOR = MODELS / "ch_PP-OCRv4_det_infer.onnx"
CLASSIFIER = MODELS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
VAD = MODELS / "silero_vad_16k_op15.onnx"
VAD_IF = MODELS / "silero_vad.onnx"


def need(path: Path) -> Path:
    """Skip (with the reason) when a shared model is not beside the checkout."""
    if not path.is_file():
        pytest.skip(f"{path} not found: put ../shared/models beside the checkout or set RUNNER_SHARED_MODELS")
    return path


class CLIResult:
    """A finished ``python -m runner`` run: exit code, output and the run directory's files."""

    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.run_dir = run_dir

    @property
    def summary(self) -> Dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def replay(self) -> Dict:
        return json.loads((self.run_dir / "replay.json").read_text())


@pytest.fixture
def run_cli(tmp_path):
    """Run ``python -m runner ARGS`` in a subprocess, as a user would, with its run dir in tmp."""
    counter = {"n": 0}

    def _run(*args: str, cwd: Optional[Path] = None, timeout: float = 600, run_dir: Optional[Path] = None) -> CLIResult:
        counter["n"] += 1
        run_dir = run_dir or tmp_path / f"run{counter['n']}"
        cmd = [sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"]
        proc = subprocess.run(cmd, cwd=cwd or tmp_path, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return CLIResult(proc, run_dir)

    return _run


def write_script(path: Path, body: str) -> Path:
    """Write a Python check script and return its path."""
    path.write_text(body)
    return path


def check_cmd(script: Path, *args: str) -> str:
    """The ``checker.cmd=...`` override for running ``script`` with this Python."""
    argv = " ".join([sys.executable, str(script), *args])
    return f'checker.cmd="{argv}"'


HAS_NODES = '''
import sys, onnx
names = {n.name for n in onnx.load(sys.argv[1], load_external_data=False).graph.node}
sys.exit(1 if all(x in names for x in sys.argv[2:]) else 0)
'''


@pytest.fixture
def has_nodes_script(tmp_path) -> Path:
    """A check that fails (exit 1) when the model holds every node named on its command line."""
    return write_script(tmp_path / "has_nodes.py", HAS_NODES)


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[onnx.ValueInfoProto],
               initializers: Sequence[onnx.TensorProto] = (), opset: int = 17) -> onnx.ModelProto:
    """A checked model from nodes and value infos."""
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def f32(name: str, shape: List) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def chain_model(n: int, shape=(1, 4)) -> onnx.ModelProto:
    """x -> Relu -> Add(const) -> Relu -> ... : ``n`` compute nodes named n0..n{n-1}, plus a Constant."""
    nodes = [helper.make_node("Constant", [], ["c"], name="const", value=helper.make_tensor("cv", TensorProto.FLOAT, list(shape), np.ones(shape, np.float32).ravel()))]
    prev = "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        if i % 2:
            nodes.append(helper.make_node("Add", [prev, "c"], [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node("Relu", [prev], [out], name=f"n{i}"))
        prev = out
    return make_model(nodes, [f32("x", list(shape))], [f32("y", list(shape))])


def branchy_model() -> onnx.ModelProto:
    """Two branches of three nodes each (a0..a2, b0..b2) joined by an Add, with two graph outputs."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 4], np.full(4, 0.5, np.float32))
    nodes = [
        helper.make_node("Relu", ["x"], ["a0o"], name="a0"),
        helper.make_node("Mul", ["a0o", "w"], ["a1o"], name="a1"),
        helper.make_node("Sigmoid", ["a1o"], ["a2o"], name="a2"),
        helper.make_node("Neg", ["x"], ["b0o"], name="b0"),
        helper.make_node("Abs", ["b0o"], ["b1o"], name="b1"),
        helper.make_node("Tanh", ["b1o"], ["b2o"], name="b2"),
        helper.make_node("Add", ["a2o", "b2o"], ["sum"], name="join"),
        helper.make_node("Identity", ["b2o"], ["side"], name="side_out"),
    ]
    return make_model(nodes, [f32("x", [1, 4])], [f32("sum", [1, 4]), f32("side", [1, 4])], [w])
