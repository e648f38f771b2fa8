"""Reduce on a 20,000-node chain under a 2 GB address-space limit: memory grows linearly, not with the square."""

from __future__ import annotations

import resource
import subprocess
import sys

import onnx
import pytest

from tests.helpers.models import chain_model

LIMIT = 2 * 2**30  # bytes


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


@pytest.mark.slow
def test_reduce_a_20k_node_chain_in_2_gb(tmp_path):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(20000), model)
    out = tmp_path / "reduced.onnx"
    # grep exits 0 when the candidate holds node n12345 (no other node or tensor name contains it): a failure
    cmd = [
        sys.executable,
        "-m",
        "runner",
        "mode=reduce",
        f"model={model}",
        'checker.cmd="grep -q n12345 {artifact}"',
        "checker.fail_codes=[0]",
        f"output={out}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, preexec_fn=_limit_memory)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [n.name for n in onnx.load(str(out)).graph.node if n.op_type != "Constant"] == ["n12345"]


def _matmul_chain(n: int, size: int = 64) -> onnx.ModelProto:
    """x @ w0 @ w1 ... : ``n`` MatMul nodes mm0.. with their own [size, size] float weights."""
    import numpy as np
    from onnx import helper, numpy_helper

    from tests.helpers.models import f32, make_model

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.random((size, size), dtype=np.float32), f"w{i}") for i in range(n)]
    nodes = [
        helper.make_node(
            "MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], ["y" if i == n - 1 else f"h{i}"], name=f"mm{i}"
        )
        for i in range(n)
    ]
    return make_model(nodes, [f32("x", [1, size])], [f32("y", [1, size])], weights)


def test_large_weights_are_written_once_and_referenced(run, tmp_path, monkeypatch):
    import strategies.reduce
    from runner.graph.model_files import external_locations
    from tests.helpers.checks import python_check

    monkeypatch.setattr(strategies.reduce, "MODEL_THRESHOLD", 1024)  # share the weights of this small model too
    model = tmp_path / "mm.onnx"
    onnx.save(_matmul_chain(6), model)
    art = tmp_path / "art"
    r = run(
        "mode=reduce",
        f"model={model}",
        *python_check("mm3"),
        "artifacts.keep_intermediate=true",
        f"artifacts.dir={art}",
    )
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["mm3"]
    weights = r.run_dir / "weights.bin"
    assert weights.stat().st_size == 6 * 64 * 64 * 4, "every weight written once"
    # iteration 1 checks a byte copy of the user's file, the last the written answer: both self-contained
    own = {"_iter1_", f"_iter{r.summary['iterations']}_"}
    search = [p for p in (art / "intermediate").glob("iter_artifact_iter*.onnx") if not any(o in p.name for o in own)]
    assert search and all(
        external_locations(onnx.load(str(p), load_external_data=False)) == ["weights.bin"] for p in search
    )
    assert all(p.stat().st_size < 4096 for p in search), "a candidate file holds only its graph"
    reduced = onnx.load(r.summary["output"], load_external_data=False)
    assert not external_locations(reduced), "the answer is self-contained"
    kept = sorted((art / "intermediate").glob("iter_artifact_iter*.onnx"))
    assert kept and all(onnx.load(str(k)).graph.initializer[0].raw_data for k in kept[1:]), "kept candidates load"


@pytest.mark.slow
def test_shared_weights_with_the_compare_checker(run, tmp_path, monkeypatch):
    import strategies.reduce

    monkeypatch.setattr(strategies.reduce, "MODEL_THRESHOLD", 1024)
    model = _matmul_chain(4)
    from onnx import numpy_helper

    w2 = numpy_helper.to_array(model.graph.initializer[2]) * 3.0
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(w2, "w2"))
    original = tmp_path / "orig.onnx"
    onnx.save(_matmul_chain(4), original)
    golden = tmp_path / "golden.npz"
    first = run("mode=repeat", "until=1", f"model={original}", "checker=compare", f"save_golden={golden}")
    assert first.returncode == 0, first.stderr
    perturbed = tmp_path / "perturbed.onnx"
    onnx.save(model, perturbed)
    r = run("mode=reduce", f"model={perturbed}", "checker=compare", f"golden={golden}")
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["mm2"]
