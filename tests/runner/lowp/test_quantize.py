"""int8 QDQ candidates (runner.lowp.quantize) and reading their structure (runner.graph.qdq)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from runner.errors import ConfigError
from runner.graph.isolate import REF_SUFFIX, isolated_model
from runner.graph.qdq import compute_nodes, input_chains, qdq_aliases, quantized_nodes
from runner.graph.validate import strict_problem
from runner.layerwise.tensors import tensor_types
from runner.lowp.calibration import calibrate
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import Quantizer, prepare_int8
from tests.helpers.int8 import integer_model, outlier_model, samples


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.fixture(scope="module")
def quantizer():
    model = prepare_int8(outlier_model())
    return Quantizer(model, calibrate(model, list(samples()), QuantOptions()), QuantOptions())


def test_the_opset_is_raised_and_every_candidate_is_a_valid_qdq_model(quantizer):
    assert max(o.version for o in quantizer.model.opset_import if o.domain in ("", "ai.onnx")) >= 13
    for kept in ([], ["scale"], ["conv1", "scale", "conv2"]):
        candidate = quantizer.convert(kept)
        assert strict_problem(candidate) is None
        _run(candidate, next(samples()))


def test_kept_nodes_read_float_tensors_and_weights(quantizer):
    full = quantizer.convert([])
    assert set(quantized_nodes(full)) == {"conv1", "scale", "conv2"}
    kept = quantizer.convert(["scale"])
    scale = next(n for n in kept.graph.node if n.name == "scale")
    assert list(scale.input) == ["t", "s"]  # conv1's output unrounded, the float weight
    assert "scale" not in quantized_nodes(kept) and {"conv1", "conv2"} <= set(quantized_nodes(kept))
    everything = quantizer.convert(["conv1", "scale", "conv2"])
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in everything.graph.node)
    assert {i.name for i in everything.graph.initializer} == {"w1", "b1", "s", "w2"}


def test_keeping_the_node_whose_input_rounding_breaks_it_restores_the_output(quantizer):
    feeds = next(samples())
    golden = _run(quantizer.model, feeds)

    def rel(model):
        return float(np.linalg.norm(_run(model, feeds) - golden) / np.linalg.norm(golden))

    assert rel(quantizer.convert([])) > 0.3
    assert rel(quantizer.convert(["scale"])) < 0.05


def test_qdq_tensors_are_matched_to_the_float_ones_and_a_node_runs_alone_with_its_own_pairs(quantizer):
    full = quantizer.convert([])
    known = {i.name for i in quantizer.model.graph.input} | {o for n in quantizer.model.graph.node for o in n.output}
    alias = qdq_aliases(full, known)
    chains = input_chains(full)
    scale = next(n for n in compute_nodes(full) if n.name == "scale")
    assert alias[scale.input[0]] == "t" and chains[scale.input[0]].source == "t"
    assert chains[scale.input[1]].source is None  # the weight, stored int8
    alone = isolated_model(full, [scale], tensor_types(full), chains=chains)
    assert [i.name for i in alone.graph.input] == ["t" + REF_SUFFIX]
    t = np.linspace(-1000, 1000, 4 * 64, dtype=np.float32).reshape(1, 4, 8, 8)
    out = ort.InferenceSession(alone.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"t" + REF_SUFFIX: t}
    )
    assert len(out) == 3  # u, then the two dequantized inputs
    u, rounded_t, rounded_s = out
    step = 2 * 1000 / 254  # symmetric int8 over the calibrated range of t, about 1000
    assert 0 < np.abs(rounded_t - t).max() <= step
    np.testing.assert_allclose(u, rounded_t * rounded_s, rtol=1e-6)


def test_bad_options_and_models_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"calibration\.method=best: use one of minmax, entropy, percentile"):
        QuantOptions.from_config({"method": "best"}, {})
    with pytest.raises(ConfigError, match=r"calibration\.samples=0"):
        QuantOptions.from_config({"samples": 0}, {})
    with pytest.raises(ConfigError, match=r"op_types_to_quantize names \['Banana'\]"):
        QuantOptions.from_config({}, {"op_types_to_quantize": ["Banana"]})
    model = prepare_int8(outlier_model())
    with pytest.raises(ConfigError, match="calibration has no input samples"):
        calibrate(model, [], QuantOptions())
    with pytest.raises(ConfigError, match=r"calibration sample 0 gives \['image'\] but the model takes \['x'\]"):
        calibrate(model, [{"image": np.zeros((1, 3, 8, 8), np.float32)}], QuantOptions())
    ints = integer_model()
    with pytest.raises(ConfigError, match="no float tensor to quantize"):
        calibrate(ints, [{"a": np.arange(4, dtype=np.int64)}], QuantOptions())


@pytest.mark.slow
@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_each_calibration_method_gives_ranges_for_every_quantized_tensor(method):
    model = prepare_int8(outlier_model())
    options = QuantOptions(method=method)
    cal = calibrate(model, list(samples()), options)
    assert {"x", "t", "u"} <= set(cal.ranges.data) and cal.samples == 4
    assert strict_problem(Quantizer(model, cal, options).convert([])) is None


@pytest.mark.slow
def test_entropy_calibration_clips_ranges_minmax_keeps():
    """Issue 38: with ONNX Runtime's default 128 bins and 128 quantized bins, entropy calibration had one
    threshold to choose, the maximum: its 253 scales on the classifier were minmax's, bit for bit. TensorRT's
    algorithm over 2048 bins of |x| clips the tails of the normal input ``x`` (3.9 -> 3.1; on 768 values the
    histogram is sparse) and of the output."""
    from tests.helpers.int8 import conv_outlier_model

    model = prepare_int8(conv_outlier_model())
    ranges = {}
    for method in ("minmax", "entropy"):
        cal = calibrate(model, list(samples()), QuantOptions(method=method))
        ranges[method] = {k: float(np.max(np.abs(v.range_value))) for k, v in cal.ranges.data.items()}
    assert ranges["entropy"]["x"] < 0.9 * ranges["minmax"]["x"] and ranges["entropy"]["y"] < ranges["minmax"]["y"]
    assert all(ranges["entropy"][k] <= ranges["minmax"][k] * 1.001 for k in ranges["minmax"])
