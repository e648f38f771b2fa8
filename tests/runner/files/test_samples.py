"""Input samples and golden values: Polygraphy's JSON (written by polygraphy itself), several samples,
val_range, data_loader, and the errors of each."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from runner.candidates import Candidate
from runner.checkers.compare import CompareChecker
from runner.context import RunContext
from runner.errors import ConfigError
from runner.files.samples import load_golden_samples, load_input_samples, parse_val_range, save_golden_samples
from runner.graph.activations import run_all_tensors
from runner.graph.feeds import generate_feeds
from tests.helpers.models import CLASSIFIER, DETECTOR, need, overflow_model

pytest.importorskip("polygraphy")


def _polygraphy(*args: str) -> None:
    """Run the polygraphy CLI (the files it writes are what users bring)."""
    cmd = [sys.executable, "-c", "import sys; from polygraphy.tools import main; sys.exit(main())", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _model_ctx(tmp_path: Path, model: onnx.ModelProto, **kw) -> RunContext:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return RunContext(mode="reduce", run_dir=tmp_path, model_path=path, **kw)


def _whole(ctx: RunContext) -> Candidate:
    return Candidate(key="whole", label="whole model", payload=lambda: ctx.model)


LOADER = """
import numpy as np

def two():
    yield {"x": np.full((1, 4), 0.5, np.float32)}
    yield {"x": np.full((1, 4), 250.0, np.float32)}

def first_only():
    return [{"x": np.full((1, 4), 0.5, np.float32)}]

def nothing():
    return []

def not_dicts():
    return [np.zeros(3)]

def raises():
    raise RuntimeError("no camera")
"""


@pytest.fixture
def loader(on_path, monkeypatch) -> str:
    """A data loader module ``feeds_for_test`` on sys.path (as the working directory is for ``python -m``)."""
    (on_path / "feeds_for_test.py").write_text(LOADER)
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "feeds_for_test", raising=False)
    return "feeds_for_test"


@pytest.mark.slow  # runs polygraphy in a subprocess
def test_polygraphy_json_written_by_polygraphy_is_read_as_samples(tmp_path):
    """``polygraphy run --save-inputs/--save-outputs`` on the classifier, three iterations of 0-255 pixels: each
    sample's inputs and golden outputs are read with Polygraphy's reader, and match ONNX Runtime on them."""
    model = need(CLASSIFIER)
    inputs, outputs = tmp_path / "in.json", tmp_path / "out.json"
    _polygraphy(
        "run", str(model), "--onnxrt", "--iterations", "3", "--val-range", "x:[0,255]",
        "--input-shapes", "x:[1,3,48,192]", "--save-inputs", str(inputs), "--save-outputs", str(outputs),
    )  # fmt: skip
    samples, golden = load_input_samples(inputs), load_golden_samples(outputs)
    assert len(samples) == len(golden) == 3
    assert all(s["x"].shape == (1, 3, 48, 192) and s["x"].min() >= 0 and s["x"].max() <= 255 for s in samples)
    assert not np.array_equal(samples[0]["x"], samples[1]["x"])
    out = onnx.load(model).graph.output[0].name
    loaded = onnx.load(model)
    for s, g in zip(samples, golden):
        np.testing.assert_allclose(run_all_tensors(loaded, s)[out], g[out], rtol=1e-5, atol=1e-6)

    ctx = RunContext(mode="reduce", run_dir=tmp_path, model_path=model, inputs=str(inputs), golden=str(outputs))
    assert ctx.shapes == {"x": [1, 3, 48, 192]}
    checker = CompareChecker.of()
    checker.bind(ctx)
    verdict = checker.check(None, 1, _whole(ctx))
    assert verdict.passed and "all 3 samples" in verdict.reason

    # the third sample's golden output moved by 0.01: the candidate fails there, and the sample is named
    moved = tmp_path / "moved.json"
    from polygraphy.comparator import RunResults

    results = RunResults.load(str(outputs))
    (_, iterations), *_ = results.items()
    iterations[2][out] = iterations[2][out] + 0.01
    results.save(str(moved))
    checker = CompareChecker.of(atol=1e-3, rtol=1e-3)
    checker.bind(RunContext(mode="reduce", run_dir=tmp_path, model_path=model, inputs=str(inputs), golden=str(moved)))
    verdict = checker.check(None, 1, _whole(ctx))
    assert not verdict.passed and verdict.reason.startswith("sample 2:") and verdict.sample == 2


def test_a_candidate_passes_only_if_every_sample_passes(tmp_path, loader):
    """Under fp16 emulation the model overflows on the second sample only: one sample passes, two fail,
    and the failing sample is named."""
    ctx = _model_ctx(tmp_path, overflow_model(), data_loader=f"{loader}.first_only")
    checker = CompareChecker.of(backend="fp16_emulation", check_error_stat="rel_l2", rtol=0.05)
    checker.bind(ctx)
    assert checker.check(None, 1, _whole(ctx)).passed

    ctx = _model_ctx(tmp_path, overflow_model(), data_loader=f"{loader}.two")
    checker = CompareChecker.of(backend="fp16_emulation", check_error_stat="rel_l2", rtol=0.05)
    checker.bind(ctx)
    verdict = checker.check(None, 1, _whole(ctx))
    assert not verdict.passed and verdict.sample == 1 and "sample 1" in verdict.reason


def test_reduce_over_two_samples_finds_the_node_only_one_of_them_breaks(run, tmp_path, loader):
    model = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), model)
    args = [
        "mode=reduce",
        f"model={model}",
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
    ]
    r = run(*args, f"data_loader={loader}.two")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["scale"]
    assert "checked on 2 input samples" in r.stdout + r.stderr
    r = run(*args, f"data_loader={loader}.first_only")
    assert r.returncode == 2 and "no failure to reduce" in r.stderr


def test_val_range_shapes_generated_inputs(tmp_path):
    assert parse_val_range(None, ["x"]) == {}
    assert parse_val_range([0, 255], ["x", "y"]) == {"x": (0, 255), "y": (0, 255)}
    assert parse_val_range({"x": [0, 255], "default": [-1, 1]}, ["x", "y"]) == {"x": (0, 255), "y": (-1, 1)}
    specs = [("x", np.dtype(np.float32), [1000]), ("i", np.dtype(np.int64), [1000]), ("b", np.dtype(np.bool_), [8])]
    feeds = generate_feeds(specs, 0, {"x": (200.0, 255.0), "i": (3, 5)})
    assert feeds["x"].min() >= 200 and feeds["x"].max() < 255 and feeds["x"].dtype == np.float32
    assert set(np.unique(feeds["i"])) == {3, 4, 5}
    plain = generate_feeds(specs, 0)
    assert plain["x"].min() >= 0 and plain["x"].max() < 1 and set(np.unique(plain["i"])) <= {0, 1}

    ctx = _model_ctx(tmp_path, overflow_model(), val_range={"x": [250, 255]})
    assert len(ctx.samples) == 1 and ctx.feeds["x"].min() >= 250


@pytest.mark.parametrize(
    "value, words",
    [
        ({"z": [0, 1]}, "not model inputs"),
        ([5, 1], "low > high"),
        ("wide", r"not \[low, high\]"),
        ({"x": [0]}, r"not \[low, high\]"),
    ],
)
def test_val_range_errors(value, words):
    with pytest.raises(ConfigError, match=words):
        parse_val_range(value, ["x"])


@pytest.mark.parametrize(
    "target, words",
    [
        ("noloader", "is neither module.function"),
        ("no_such_module_here.fn", "cannot import"),
        ("{mod}.missing", "has no missing"),
        ("{mod}.nothing", "yielded no feed dicts"),
        ("{mod}.not_dicts", "not a mapping"),
        ("{mod}.raises", "raised RuntimeError: no camera"),
    ],
)
def test_data_loader_errors(tmp_path, loader, target, words):
    ctx = _model_ctx(tmp_path, overflow_model(), data_loader=target.format(mod=loader))
    with pytest.raises(ConfigError, match=words):
        _ = ctx.samples


def test_one_source_of_inputs(tmp_path, loader):
    np.savez(tmp_path / "x.npz", x=np.ones((1, 4), np.float32))
    both = _model_ctx(tmp_path, overflow_model(), inputs=str(tmp_path / "x.npz"), data_loader=f"{loader}.two")
    with pytest.raises(ConfigError, match="keep one"):
        _ = both.samples
    ranged = _model_ctx(tmp_path, overflow_model(), inputs=str(tmp_path / "x.npz"), val_range=[0, 1])
    with pytest.raises(ConfigError, match="generated inputs only"):
        _ = ranged.samples


def test_samples_must_fit_the_model(tmp_path):
    """The shape rule holds for every loaded sample, and golden values need the inputs they came from."""
    from polygraphy.json import save_json

    bad = tmp_path / "bad.json"
    save_json([{"x": np.ones((1, 4), np.float32)}, {"x": np.ones((1, 5), np.float32)}], str(bad))
    with pytest.raises(ConfigError, match=r"sample 1: x has shape \[1, 5\]"):
        _ = _model_ctx(tmp_path, overflow_model(), inputs=str(bad)).samples

    good = tmp_path / "in.json"
    save_json([{"x": np.ones((1, 4), np.float32)}] * 2, str(good))
    ctx = _model_ctx(tmp_path, overflow_model(), inputs=str(good))
    golden = tmp_path / "golden.json"
    save_golden_samples(golden, [{"y": np.ones((1, 4), np.float32)}] * 3)
    checker = CompareChecker.of()
    with pytest.raises(ConfigError, match="holds 3 samples but the inputs 2"):
        checker.bind(dataclasses.replace(ctx, golden=str(golden)))
    with pytest.raises(ConfigError, match="holds no values for the model inputs"):
        checker.bind(_model_ctx(tmp_path, overflow_model(), golden=str(golden)))
    with pytest.raises(ConfigError, match=r"an \.npz holds one sample"):
        checker.bind(dataclasses.replace(ctx, save_golden=str(tmp_path / "g.npz")))


def test_save_golden_json_round_trips_through_polygraphy(tmp_path, loader):
    """save_golden=.json writes Polygraphy's RunResults with every sample; golden= reads it back as the
    inputs and golden values of each sample."""
    saved = tmp_path / "golden.json"
    ctx = _model_ctx(tmp_path, overflow_model(), data_loader=f"{loader}.two", save_golden=str(saved))
    CompareChecker.of().bind(ctx)
    from polygraphy.comparator import RunResults

    (runner, iterations), *_ = RunResults.load(str(saved)).items()
    assert runner == "golden" and len(iterations) == 2 and {"x", "big", "small", "y"} <= set(iterations[1].keys())
    again = _model_ctx(tmp_path, overflow_model(), golden=str(saved))
    assert [s["x"][0, 0] for s in again.samples] == [0.5, 250.0]
    checker = CompareChecker.of(backend="fp16_emulation", check_error_stat="rel_l2", rtol=0.05)
    checker.bind(again)
    assert not checker.check(None, 1, _whole(again)).passed


@pytest.mark.slow
def test_reduce_the_fp32_detector_on_polygraphy_mark_all_golden_values(run, tmp_path):
    """The issue's acceptance on files polygraphy wrote: two samples of 0-255 pixels and every tensor's golden
    value (``--onnx-outputs mark all``) from ``polygraphy run``. The fp32 detector's BatchNormalization goes past
    fp16; reduce on the fp32 model under emulation, judged by rel_l2, ends at that node."""
    inputs, golden = tmp_path / "in.json", tmp_path / "golden.json"
    _polygraphy(
        "run", str(need(DETECTOR)), "--onnxrt", "--onnx-outputs", "mark", "all", "--iterations", "2",
        "--val-range", "x:[0,255]", "--input-shapes", "x:[1,3,64,64]",
        "--save-inputs", str(inputs), "--save-outputs", str(golden),
    )  # fmt: skip
    r = run(
        "mode=reduce",
        f"model={DETECTOR}",
        f"inputs={inputs}",
        f"golden={golden}",
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    names = [n["name"] for n in r.summary["reduced_nodes"]]
    assert "p2o.BatchNormalization.1" in names and len(names) <= 3
    answer = r.summary["answer_outputs"]["batch_norm_0.tmp_3"]
    assert not answer["passed"] and answer["rel_l2"] > 1


def test_polygraphy_json_without_polygraphy_names_the_extra(tmp_path, monkeypatch):
    from runner.errors import MissingExtraError

    (tmp_path / "in.json").write_text("[]")
    monkeypatch.setitem(sys.modules, "polygraphy", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(MissingExtraError, match=r"install the 'polygraphy' extra"):
        load_input_samples(tmp_path / "in.json")
