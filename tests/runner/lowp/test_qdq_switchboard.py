"""int8's switchboard: one switched model gives every candidate of TensorRT's placement its own bits."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Dict, List

import numpy as np
import onnx
import pytest

from runner.backends.onnxruntime import OnnxRuntimeBackend
from runner.lowp.calibration import calibrate
from runner.lowp.placement import PlacedQuantizer
from runner.lowp.qdq_switchboard import build_qdq_switchboard
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import make_quantizer, prepare_int8
from runner.lowp.switchboard import LazySwitchboard, RunsOn
from tests.helpers.int8 import conv_outlier_model, dense_model
from tests.helpers.models import need

SHARED = Path(__file__).resolve().parents[4] / "shared" / "models"


def _quantizer(model: onnx.ModelProto, samples: List[Dict[str, np.ndarray]], **options) -> PlacedQuantizer:
    prepared = prepare_int8(model)
    quantizer = make_quantizer(prepared, calibrate(prepared, samples, QuantOptions()), QuantOptions(**options))
    assert isinstance(quantizer, PlacedQuantizer)
    return quantizer


def _agree(quantizer: PlacedQuantizer, feeds: Dict[str, np.ndarray], trials: int) -> int:
    """Run random kept sets (and none, and all) built and switched; the number whose outputs differ
    by a bit (asserting nothing: the caller says how many may)."""
    board = build_qdq_switchboard(quantizer, "test")
    assert board is not None
    nodes = quantizer.model.graph.node
    assert {nodes[i].name for i in board.switches} == set(quantizer.sites), "one switch per sited node"
    ort = OnnxRuntimeBackend(graph_optimization_level="disable")  # as the checks run: Q/DQ as written
    rng = random.Random(0)
    layers = sorted(board.switches)
    sets = [frozenset(), frozenset(layers)] + [
        frozenset(rng.sample(layers, rng.randrange(1, len(layers)))) for _ in range(trials)
    ]
    differ = 0
    for kept in sets:
        built = quantizer.convert([nodes[i].name for i in kept])
        want = ort.run(built, feeds)
        got = ort.run(board.model, {**feeds, **board.feeds(kept)}, key="board")
        assert list(got) == list(want)
        differ += int(any(not np.array_equal(got[n], want[n], equal_nan=True) for n in want))
    ort.close()
    return differ


def _pixels(seed: int, count: int, side: int = 32) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.random((1, 3, side, side)).astype(np.float32)} for _ in range(count)]


def _pages() -> List[Dict[str, np.ndarray]]:
    """Two rendered text pages, cropped to 64x64 (text in each: int8 changes 8% of the text map)."""
    from examples.text_pages import detector_pages

    return [{"x": page["x"][:, :, :64, :64].copy()} for page in list(detector_pages())[:2]]


@pytest.fixture(scope="module")
def detector():
    """The detector's quantizer with TensorRT's placement (146 sited nodes) and a page."""
    model = onnx.load(str(need(SHARED / "ch_PP-OCRv4_det_infer.onnx")))
    samples = _pages()
    return _quantizer(model, samples), samples[0]


def test_the_detector_gives_the_built_candidates_bits(detector):
    """Conv data and per-channel weights, pools, Resize, residual Adds, shared inputs read twice."""
    assert _agree(*detector, 2) == 0


@pytest.mark.slow
def test_per_tensor_weights_give_the_built_candidates_bits():
    model = onnx.load(str(need(SHARED / "ch_PP-OCRv4_det_infer.onnx")))
    samples = _pages()
    assert _agree(_quantizer(model, samples, per_channel=False), samples[0], 3) == 0


def test_a_transformer_export_gives_the_built_candidates_bits():
    """MatMul of two activations (attention: both per tensor), Gemm/MatMul weights per channel."""
    model = onnx.load(str(need(SHARED / "zoo" / "bert_tiny.onnx")))
    inputs = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in np.load(SHARED / "zoo" / "bert_tiny.npz").items() if k in inputs}
    quantizer = _quantizer(model, [feeds])
    if not quantizer.sites:
        pytest.skip("the placement quantizes no node of this export (its dims are under 16)")
    assert _agree(quantizer, feeds, 3) == 0


def test_the_outlier_and_a_dense_chain_give_the_built_candidates_bits():
    samples = _pixels(1, 2, 8)
    assert _agree(_quantizer(conv_outlier_model(), samples), samples[0], 2) == 0
    assert _agree(_quantizer(dense_model(16, channels=8), samples), samples[0], 4) == 0


def test_no_switchboard_where_nothing_is_quantized():
    """Bodies and large weights are ``runner.lowp.switchboard.unsupported``'s, shared with fp16 (its tests)."""
    samples = _pixels(1, 1, 8)
    narrow = _quantizer(dense_model(4), samples)  # 3 channels: TensorRT has no faster int8 kernel
    assert not narrow.sites and build_qdq_switchboard(narrow, "k") is None


def test_a_qdq_switchboard_pickles_as_none_and_runs_on_onnxruntime():
    samples = _pixels(1, 1, 8)
    quantizer = _quantizer(conv_outlier_model(), samples)
    lazy = LazySwitchboard(lambda: build_qdq_switchboard(quantizer, "k"), RunsOn.ONNXRUNTIME)
    first = lazy.get()
    assert first is not None and lazy.get() is first
    copied = pickle.loads(pickle.dumps(lazy))
    assert copied.get() is None and copied.runs_on is RunsOn.ONNXRUNTIME
