"""mode=precision on decoders whose attention overflows fp16 in every layer (``examples.planted.attention_decoder``):
the repeated blocks are searched once, the checks do not grow with depth, and the answer says at what level it
is 1-minimal."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import onnx
import pytest

from examples.planted import attention_decoder

CHECK = ["checker=compare", "checker.backend=fp16_emulation", "checker.check_error_stat=rel_l2", "checker.rtol=0.05"]


def decoder_files(directory: Path, layers: int, overflowing: Optional[Sequence[int]] = None) -> tuple:
    model, needed, ids = attention_decoder(layers=layers, overflowing=overflowing)
    path, inputs = directory / f"decoder{layers}.onnx", directory / f"ids{layers}.npz"
    onnx.save(model, path)
    np.savez(inputs, ids=ids)
    return needed, [f"model={path}", f"inputs={inputs}"]


def kept(summary) -> List[str]:
    return sorted(n["name"] for n in summary["kept_nodes"])


@pytest.mark.slow
def test_attention_overflowing_in_every_layer_costs_the_same_checks_at_any_depth(run, tmp_path):
    """4 and 12 layers: the same 16 checks (the search's 12, 2 gates, the answer's check), each overflowing
    layer's score MatMul, scale Mul, mask Add and Softmax kept, tied over the layers; the node-level search
    (``tie_blocks=false``) keeps the same nodes in 61 checks at 12 layers."""
    checks = {}
    for layers in (4, 12):
        needed, files = decoder_files(tmp_path, layers)
        r = run("mode=precision", "marker=minimal", *files, *CHECK, f"output=mixed{layers}.onnx")
        assert r.returncode == 0, r.stdout[-2000:]
        assert kept(r.summary) == sorted(needed)
        assert r.summary["answer_verified"]["passed"]
        blocks = r.summary["blocks"]
        assert blocks["found_by"] == "name scopes" and blocks["families"] == {"layers": layers}
        assert blocks["minimal_at"] == "block positions"
        positions = {p["position"]: p for p in blocks["kept_positions"]}
        assert sorted(positions) == [f"layers.*.self_attn.{n}" for n in ("mask", "scale", "scores", "softmax")]
        assert all(p["unit"] and len(p["blocks"]) == layers for p in positions.values())
        checks[layers] = r.summary["checks"]
    assert checks[12] == checks[4] <= 20
    needed, files = decoder_files(tmp_path, 12)
    nodes = run("mode=precision", "marker=minimal", *files, *CHECK, "tie_blocks=false", "output=nodes.onnx")
    assert nodes.returncode == 0 and kept(nodes.summary) == sorted(needed)
    assert "blocks" not in nodes.summary and nodes.summary["checks"] > 3 * checks[12]


@pytest.mark.slow
def test_an_overflow_in_one_layer_is_untied_to_its_nodes(run, tmp_path):
    needed, files = decoder_files(tmp_path, 12, overflowing=[7])
    r = run("mode=precision", "marker=minimal", *files, *CHECK, "output=mixed.onnx")
    assert r.returncode == 0, r.stdout[-2000:]
    assert kept(r.summary) == sorted(needed)
    assert r.summary["blocks"]["minimal_at"] == "nodes"
    assert all(p["blocks"] == ["layers.7"] and not p["unit"] for p in r.summary["blocks"]["kept_positions"])
    assert r.summary["checks"] <= 25


@pytest.mark.slow
def test_untie_nodes_shows_each_kept_node_needed(run, tmp_path):
    """``untie=nodes`` searches each kept position block by block: the same nodes, 1-minimal at node level;
    ``untie=none`` reports the tied answer as it is."""
    needed, files = decoder_files(tmp_path, 4)
    r = run("mode=precision", "marker=minimal", *files, *CHECK, "untie=nodes", "output=mixed.onnx")
    assert r.returncode == 0, r.stdout[-2000:]
    assert kept(r.summary) == sorted(needed)
    assert r.summary["blocks"]["minimal_at"] == "nodes" and r.summary["blocks"]["untie"] == "nodes"
    tied = run("mode=precision", "marker=minimal", *files, *CHECK, "untie=none", "output=tied.onnx")
    assert kept(tied.summary) == sorted(needed) and tied.summary["checks"] < r.summary["checks"]
    assert tied.summary["blocks"]["minimal_at"] == "block positions"
