"""mode=precision on graphs with planted fp16 overflows and on the real detector, through the CLI."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from examples.planted import GRAPHS
from runner.candidates import Candidate
from runner.checkers.compare import CompareChecker
from runner.context import RunContext
from tests.helpers.models import DETECTOR, need

CHECK = ["checker=compare", "checker.backend=fp16_emulation", "checker.atol=1e-3", "checker.rtol=1e-2"]


def _setup(tmp_path, name):
    model, needed, scale = GRAPHS[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=(scale * (1 + np.random.default_rng(0).random((1, 8)))).astype(np.float32))
    order = [n.name for n in model.graph.node]
    return path, inputs, needed, order


def _passes(model_path, original, inputs):
    checker = CompareChecker.of(backend="fp16_emulation", atol=1e-3, rtol=1e-2)
    checker.bind(RunContext(mode="precision", run_dir=original.parent, model_path=original, inputs=str(inputs)))
    return checker.check(model_path, 1, Candidate("final", "final")).passed


@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize(
    "marker, direction",
    [
        ("bisect", "forward"),
        ("bisect", "reverse"),
        ("linear", "forward"),
        ("linear", "reverse"),
        ("minimal", "forward"),
    ],
)
@pytest.mark.slow
def test_planted_overflows(run, tmp_path, graph, marker, direction):
    path, inputs, needed, order = _setup(tmp_path, graph)
    out = tmp_path / "mixed.onnx"
    r = run(
        "mode=precision",
        f"marker={marker}",
        f"direction={direction}",
        f"model={path}",
        f"inputs={inputs}",
        f"output={out}",
        *CHECK,
    )
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    s = r.summary
    kept = [n["name"] for n in s["kept_nodes"]]
    assert s["total"] == len(order) and s["kept"] == len(kept)
    positions = [order.index(n) for n in needed]
    if marker == "minimal":
        assert sorted(kept) == sorted(needed), "the minimal marker keeps exactly the needed nodes"
    elif direction == "forward":
        # Polygraphy's algorithm: the shortest prefix from the inputs that passes
        assert kept == order[: max(positions) + 1]
    else:
        assert kept == order[min(positions) :]
    assert _passes(out, path, inputs), "the written mixed-precision model passes the check"
    types = {n.name: n for n in onnx.load(str(out)).graph.node}
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT, "I/O types kept"
    assert len(types) >= len(order)


def test_nothing_needed_keeps_nothing(run, tmp_path):
    path, inputs, _, _ = _setup(tmp_path, "chain")
    np.savez(inputs, x=np.ones((1, 8), np.float32))  # no overflow at x = 1
    r = run("mode=precision", f"model={path}", f"inputs={inputs}", f"output={tmp_path / 'o.onnx'}", *CHECK)
    assert r.returncode == 0, r.stderr
    # all kept, the first search candidate (it passes), then no node kept (it passes too: the answer)
    assert r.summary["kept"] == 0 and r.summary["checks"] == 4, "all kept, none kept, the answer as written"


def test_unreachable_accuracy_is_an_error(run, tmp_path):
    path, inputs, _, _ = _setup(tmp_path, "chain")
    golden = tmp_path / "golden.npz"
    np.savez(golden, y=np.zeros((1, 8), np.float32), x=np.load(inputs)["x"])
    r = run("mode=precision", f"model={path}", f"golden={golden}", *CHECK)
    assert r.returncode == 2 and "fails even with every node in float32" in r.stderr


def test_bf16_low_precision(run, tmp_path):
    path, inputs, _needed, _ = _setup(tmp_path, "one_sensitive")
    model = onnx.load(str(path))
    model.opset_import[0].version = 17
    onnx.save(model, path)
    out = tmp_path / "bf16.onnx"
    # bf16 keeps fp32's range: the 1e5 weight is fine, and only rounding (3 significant digits) remains
    r = run(
        "mode=precision",
        "marker=minimal",
        "low_precision=bfloat16",
        f"model={path}",
        f"inputs={inputs}",
        f"output={out}",
        "checker=compare",
        "checker.backend=bf16_emulation",
        "checker.rtol=2e-2",
    )
    assert r.returncode == 0, r.stderr + r.stdout[-1500:]
    assert r.summary["kept"] == 0 and r.summary["low_precision"] == "bfloat16"
    types = {t.data_type for t in onnx.load(str(out)).graph.initializer}
    assert TensorProto.BFLOAT16 in types


def test_precision_float16_high_is_refused(run, tmp_path):
    path, _inputs, _, _ = _setup(tmp_path, "chain")
    r = run("mode=precision", "precision=float16", f"model={path}", *CHECK)
    assert r.returncode == 2 and "precision=float32" in r.stderr


@pytest.mark.slow
def test_detector_fed_unnormalised_pixels(run, tmp_path):
    """The real detector with 0-255 input: fp16 breaks it. Ranked by introduced error, the minimal marker keeps
    its BatchNormalization alone in 3 checks; bisect over the ranking (direction=ranked) stays within
    2 ceil(log2 n) checks and keeps far fewer than Polygraphy's topological prefix (322 of 330 nodes, see
    benchmarks/precision_markers.py). Each answer passes the check."""
    model = need(DETECTOR)
    inputs = tmp_path / "pixels.npz"
    np.savez(inputs, x=(np.random.default_rng(0).random((1, 3, 64, 64)) * 255).astype(np.float32))
    check = [
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
    ]
    results = {}
    for marker, direction in (("minimal", "forward"), ("bisect", "ranked")):
        out = tmp_path / f"{marker}-{direction}.onnx"
        r = run(
            "mode=precision",
            f"marker={marker}",
            f"direction={direction}",
            f"model={model}",
            f"inputs={inputs}",
            f"output={out}",
            *check,
        )
        assert r.returncode == 0, r.stderr + r.stdout[-1500:]
        results[marker, direction] = r.summary
        checker = CompareChecker.of(backend="fp16_emulation", check_error_stat="rel_l2", rtol=0.05)
        checker.bind(RunContext(mode="precision", run_dir=tmp_path, model_path=model, inputs=str(inputs)))
        assert checker.check(out, 1, Candidate(marker, marker, as_typed=True)).passed
    minimal, ranked = results["minimal", "forward"], results["bisect", "ranked"]
    assert [n["name"] for n in minimal["kept_nodes"]] == ["p2o.BatchNormalization.1"] and minimal["checks"] <= 4
    assert minimal["answer_outputs"]["sigmoid_0.tmp_0"]["passed"], "the summary gives the answer's own statistics"
    # bisect trusts monotonicity, which mixed precision only roughly has (82 ranked nodes kept fail at rel L2
    # 0.054): its answer is a prefix, not 1-minimal, yet a quarter of Polygraphy's topological one
    assert ranked["checks"] <= 2 * math.ceil(math.log2(330))
    assert minimal["kept"] < ranked["kept"] and 3 * ranked["kept"] < 322


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_sweep(tmp_path, launcher):
    """A 2 x 2 multirun, serially (Hydra's basic launcher) and in parallel (joblib)."""
    import subprocess
    import sys

    if launcher == "joblib":
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    path, inputs, _, _ = _setup(tmp_path, "one_sensitive")
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "runner",
        "-m",
        "mode=precision",
        "direction=forward,reverse",
        "marker=bisect,linear",
        f"model={path}",
        f"inputs={inputs}",
        *CHECK,
        f"hydra.sweep.dir={sweep}",
        "output=mixed.onnx",
        *(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        assert (job / ".hydra" / "config.yaml").is_file() and (job / "summary.json").is_file()
        assert (job / "mixed.onnx").is_file(), "each job writes its own output"
    rows = json.loads((sweep / "sweep.json").read_text())
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert "Sweep of 4 runs" in proc.stdout
    table = proc.stdout.split("Sweep of 4 runs")[1]
    assert "direction=reverse" in table and "marker=linear" in table and "kept" in table


@pytest.mark.slow
def test_rerun_from_snapshot(run_cli, tmp_path):
    path, inputs, _needed, _ = _setup(tmp_path, "two_branches")
    first = run_cli(
        "mode=precision", "marker=minimal", f"model={path}", f"inputs={inputs}", "output=first.onnx", *CHECK
    )
    assert first.returncode == 0, first.stderr
    again = run_cli("--config-path", str(first.run_dir / ".hydra"), "--config-name", "config", "output=again.onnx")
    assert again.returncode == 0, again.stderr
    assert again.summary["kept_nodes"] == first.summary["kept_nodes"]


@pytest.mark.slow
def test_rmsnorm_overflow_ranks_first_in_precision_and_layerwise(run, tmp_path, monkeypatch):
    """A Llama/Qwen2-style decoder whose first RMSNorm's x*x overflows fp16 (issue 34): its Pow overflows
    to inf and 1/sqrt(inf) = 0 is finite, which the ranking took for an absorbed divergence and put the
    four needed nodes last (69 checks on a 56M model). Now they rank first, the search keeps exactly
    them in a few checks, and layerwise names the Pow first by the same rule. Each weight is converted
    to fp16 once in the run: the search's candidates reuse the ranking's converter."""
    from runner.lowp import convert
    from tests.helpers.graphs import DECODER_CHECK, rmsnorm_decoder_files

    converted = []

    def counted(values, *args):
        converted.append(hashlib.sha1(values.tobytes()).hexdigest())  # the decoder's weights are distinct
        return to_fp16(values, *args)

    to_fp16 = convert.float16_of
    monkeypatch.setattr(convert, "float16_of", counted)

    needed, _, files = rmsnorm_decoder_files(tmp_path, layers=4)
    r = run("mode=precision", "marker=minimal", *files, "output=mixed.onnx", *DECODER_CHECK)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert sorted(n["name"] for n in r.summary["kept_nodes"]) == sorted(needed)
    assert r.summary["checks"] <= 2 * math.ceil(math.log2(len(needed))) + len(needed) + 4  # search, 2 gates, answer
    assert r.summary["answer_verified"]["passed"]
    assert converted and sorted(converted) == sorted(set(converted)), "a weight converted twice"
    report = run("mode=layerwise", *files, *DECODER_CHECK)
    assert report.returncode == 0, report.stderr
    assert report.summary["first_divergence"]["node"] == "norm_in.pow"
    assert [t["node"] for t in report.summary["top_introduced"][:4]] == needed


@pytest.mark.slow  # 1.0-1.4 s: two precision runs, at the 1.5 s limit of an unmarked test
def test_a_ranking_memory_budget_compares_in_chunks_and_keeps_the_same_nodes(run, tmp_path):
    """``ranking_memory_mb`` bounds the tensor values the ranking holds at once (the int8 detector on
    rendered pages: 952 MB without it, 656 MB at its default 512); below the model's values the nodes are
    compared in chunks, ranked as before, and the search keeps the same nodes. Not a positive number: one
    line, exit 2."""
    from tests.helpers.cli import one_line_error
    from tests.helpers.graphs import DECODER_CHECK, rmsnorm_decoder_files

    needed, _, files = rmsnorm_decoder_files(tmp_path, layers=1)
    args = ["mode=precision", "marker=minimal", *files, *DECODER_CHECK]
    r = run(*args, "ranking_memory_mb=0.1", "output=mixed.onnx")
    assert r.returncode == 0, r.stdout[-2000:]
    assert sorted(n["name"] for n in r.summary["kept_nodes"]) == sorted(needed)
    assert "chunks of nodes" in (r.run_dir / "runner.log").read_text()
    one_line_error(run(*args, "ranking_memory_mb=0"), "ranking_memory_mb=0", "positive", code=2)


@pytest.mark.slow  # two precision runs of up to 10 checks
def test_a_run_whose_every_candidate_fails_for_the_pipeline_stops_in_a_few_checks(run, tmp_path):
    """Issue 54: the model as given passes, but what every candidate shares (here the tensor types its shape
    inference declares; for an SSD, a converted graph's NMS on tied scores) flips the check. The run checks every node
    kept as candidates are built once a large candidate fails, and stops there with one line naming the fixes,
    instead of searching the whole model and ending "not verified" (exit 3). The same in a small model, where
    no candidate is large: once the search ends with no pass."""
    from onnx import helper

    from examples.planted import f32, make_model
    from tests.helpers.cli import one_line_error

    for length in (96, 6):
        nodes = [
            helper.make_node("Relu" if i % 2 else "Abs", [f"t{i}" if i else "x"], [f"t{i + 1}"], name=f"n{i}")
            for i in range(length)
        ]
        nodes.append(helper.make_node("Neg", [f"t{length}"], ["y"], name="out"))
        path = tmp_path / f"chain{length}.onnx"
        onnx.save(make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])]), path)
        r = run(
            "mode=precision",
            "marker=minimal",
            f"model={path}",
            "checker=python",
            "checker.target=tests.helpers.checks.declares_no_tensor_types",
            f"output={tmp_path / 'mixed.onnx'}",
        )
        one_line_error(r, "every node kept in float32 fails as candidates are built", "checker.outputs", code=2)
        assert r.summary["checks"] <= (10 if length > 32 else 2 * length + 4), length  # a small model: searched whole


def test_a_detector_whose_decisions_flip_as_candidates_are_built_stops_after_two_checks(run, tmp_path):
    """Issue 74: a near-tied SSD whose NMS output changes between two builds of the same fp32 graph ended after
    11 checks. A model whose outputs are decisions has every node kept, as candidates are built, checked right
    after the model as given (here the check fails any model that declares tensor types, as built ones do)."""
    from tests.helpers.cli import one_line_error
    from tests.helpers.models import unstable_detector

    path = tmp_path / "ssd.onnx"
    onnx.save(unstable_detector(), path)
    r = run(
        "mode=precision",
        "marker=minimal",
        f"model={path}",
        "checker=python",
        "checker.target=tests.helpers.checks.declares_no_tensor_types",
        f"output={tmp_path / 'mixed.onnx'}",
    )
    one_line_error(r, "every node kept in float32 fails as candidates are built", code=2)
    assert r.summary["checks"] <= 4
