"""The 7B benchmark's generator (``benchmarks/planted_decoder.py``) at a tiny size: the faults it plants are the ones
the precision search finds, node for node, with the checks the 0.5B benchmark takes (issue 75)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from planted_decoder import PRESETS, write_decoder  # noqa: E402

from runner.graph.activations import run_all_tensors  # noqa: E402


def test_the_faults_are_planted_as_measured(tmp_path):
    """Each layer's scaled scores carry an offset past the logit peak (a power of 2 squared: at most 4x it), the
    same for every key of a row to fp32's last bits, so softmax gives what it gives without it; the final norm's
    input peaks at the peak; the data file holds every weight, aligned for mapping, and the model checks."""
    for fault in ("attention", "norm"):
        out = tmp_path / fault
        out.mkdir()
        facts = write_decoder(out, *PRESETS["tiny"], fault=fault)
        onnx.checker.check_model(facts["model"])
        model = onnx.load(facts["model"])
        values = run_all_tensors(model, {"ids": np.load(facts["inputs"])["ids"]})
        if fault == "attention":
            for i in range(2):
                scaled = values[f"layers.{i}.self_attn.scale"]
                assert 1e6 <= float(np.abs(scaled).max()) <= 4e6
                rows = scaled - scaled.max(-1, keepdims=True)  # the causal mask's own -3.4e38 aside
                assert float(np.abs(rows[np.abs(rows) < 1e6]).max()) < 50  # the offset is the row's, not a key's
        else:
            assert 1900 < float(np.abs(values["norm.cast"]).max()) <= 2000
        assert (out / "decoder.onnx.data").stat().st_size == facts["weight_bytes"]
        assert json.loads((out / "needed.json").read_text())["needed"] == facts["needed"]


@pytest.mark.slow
@pytest.mark.parametrize("fault, layers, checks", [("attention", 2, 16), ("norm", 2, 12), ("attention", 28, 16)])
def test_the_precision_search_keeps_the_planted_nodes(run, tmp_path, fault, layers, checks):
    """The planted nodes and nothing else, also 28 layers deep (7B's depth): fp16's rounding elsewhere moves the
    logits by little (a fault planted by scaling q_proj and k_proj made attention hard, and 28 layers of it needed
    most of the graph kept)."""
    facts = write_decoder(tmp_path, layers, *PRESETS["tiny"][1:], fault=fault)
    r = run(
        "mode=precision", "marker=minimal", f"model={facts['model']}", f"inputs={facts['inputs']}", "checker=compare",
        "checker.backend=fp16_emulation", "checker.check_error_stat=rel_l2", "checker.rtol=0.05",
        f"output={tmp_path / 'mixed.onnx'}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(n["name"] for n in r.summary["kept_nodes"]) == sorted(facts["needed"])
    assert r.summary["checks"] <= checks and r.summary["answer_verified"]["check_passed"]
