"""The repro bundle: reduced.onnx with the values that make it fail, reproducible through Polygraphy."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers.models import DETECTOR, need


def _perturbed_detector(path: Path, conv: str = "p2o.Conv.61") -> Path:
    """The detector with one Conv's weight multiplied by -4 (its weight is a Constant node)."""
    model = onnx.load(str(need(DETECTOR)))
    node = next(n for n in model.graph.node if n.name == conv)
    weight = next(n for n in model.graph.node if node.input[1] in n.output).attribute[0].t
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * -4.0, weight.name))
    onnx.save(model, path)
    return path


@pytest.mark.slow
def test_the_bundle_of_a_reduced_detector_reproduces_the_failure_through_polygraphy(run, tmp_path):
    x = tmp_path / "x.npz"
    np.savez(x, x=np.random.default_rng(0).random((1, 3, 64, 64)).astype(np.float32))
    golden = tmp_path / "golden.json"
    clean = run(
        "mode=repeat", "until=1", f"model={need(DETECTOR)}", "checker=compare", f"inputs={x}", f"save_golden={golden}"
    )
    assert clean.returncode == 0, clean.stderr[-2000:]
    model = _perturbed_detector(tmp_path / "perturbed.onnx")
    out = tmp_path / "reduced.onnx"
    r = run("mode=reduce", f"model={model}", "checker=compare", f"golden={golden}", f"inputs={x}", f"output={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    s = r.summary
    assert [n["name"] for n in s["reduced_nodes"]] == ["p2o.Conv.61"]
    assert s["repro_inputs"] == str(tmp_path / "reduced_inputs.json") and s["repro_golden"] == str(
        tmp_path / "reduced_golden.json"
    )
    polygraphy = str(Path(sys.executable).parent / "polygraphy")
    base = [polygraphy, "run", str(out), "--onnxrt", "--load-inputs", s["repro_inputs"]]
    runs = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert runs.returncode == 0, "the inputs feed the reduced model: " + runs.stdout[-2000:] + runs.stderr[-2000:]
    fails = subprocess.run([*base, "--load-outputs", s["repro_golden"]], capture_output=True, text=True, timeout=300)
    assert fails.returncode != 0 and "Mismatched outputs" in fails.stdout + fails.stderr, fails.stdout[-2000:]
    names = [i.name for i in onnx.load(str(out)).graph.input]
    assert sorted(json.loads(Path(s["repro_inputs"]).read_text())[0]) == sorted(names)
    # issue 52: the command judges at the run's tolerance, not at Polygraphy's default 1e-5
    command = shlex.split(s["repro_command"])
    assert command[-4:] == ["--atol", "0.001", "--rtol", "0.001"]
    repro = subprocess.run([polygraphy, *command[1:]], capture_output=True, text=True, timeout=300)
    assert repro.returncode != 0 and "Mismatched outputs" in repro.stdout + repro.stderr


@pytest.mark.slow
def test_the_bundle_of_an_fp16_reduce_reproduces_the_failure_as_the_run_saw_it(run, tmp_path):
    """Issue 38: under fp16 emulation the failure is the subgraph's fp16 conversion's, and the documented
    polygraphy command on the fp32 reduced.onnx passed. The bundle now holds the subgraph as the check ran it
    (converted and rounded through Casts), and its repro_command fails with polygraphy as the run did."""
    from tests.helpers.models import MODELS

    bert = need(MODELS / "zoo" / "bert_tiny.onnx")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **dict(np.load(bert.with_suffix(".npz"))))
    out = tmp_path / "reduced.onnx"
    check = [
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
    ]
    r = run("mode=reduce", f"model={bert}", f"inputs={inputs}", f"output={out}", *check)
    assert r.returncode == 0, r.stderr[-2000:]
    s = r.summary
    assert s["repro_model"] == str(tmp_path / "reduced_float16_emulated.onnx")
    polygraphy = str(Path(sys.executable).parent / "polygraphy")
    command = shlex.split(s["repro_command"])
    assert command[:3] == ["polygraphy", "run", s["repro_model"]]
    fails = subprocess.run([polygraphy, *command[1:]], capture_output=True, text=True, timeout=300)
    assert fails.returncode != 0 and "Mismatched outputs" in fails.stdout + fails.stderr, fails.stdout[-2000:]
    fp32 = [polygraphy, "run", str(out), "--onnxrt", "--load-inputs", s["repro_inputs"], "--load-outputs"]
    passes = subprocess.run([*fp32, s["repro_golden"]], capture_output=True, text=True, timeout=300)
    assert passes.returncode == 0, "the fp32 subgraph alone passes: the failure needs the fp16 conversion"
