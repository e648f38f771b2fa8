"""Any quantizer's model (``quantized_model=``, ``runner.lowp.given_qdq``) and fp8 as TensorRT deploys it
(``low_precision=float8``, ``runner.lowp.fp8``): the fewest nodes taken out of Q/DQ, verified as written."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from runner.graph.qdq import has_qdq, quantized_nodes
from runner.lowp.given_qdq import GivenQuantizer, check_rebuilt
from runner.lowp.quantize import prepare_int8
from tests.helpers.cli import one_line_error
from tests.helpers.int8 import calibration_reader, conv_outlier_model, outlier_model, samples
from tests.helpers.models import sha256

CHECK = ["checker=compare", "checker.check_error_stat=rel_l2", "checker.rtol=0.05"]


def _quantize_static(model_path, out, per_channel=True):
    """The model quantized by ONNX Runtime's ``quantize_static`` (QDQ format), as a user would make it."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    quantize_static(
        str(model_path), str(out), calibration_reader(samples()), quant_format=QuantFormat.QDQ, per_channel=per_channel
    )
    return out


@pytest.fixture
def outlier(tmp_path):
    """The outlier model (the Mul ``scale`` must stay float) and its ``quantize_static`` QDQ model."""
    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(opset=13), model)
    return model, _quantize_static(model, tmp_path / "outlier_qdq.onnx")


def test_quantize_statics_model_rebuilt_bit_for_bit_and_its_kept_node_reads_floats(outlier):
    model, qdq = outlier
    given = onnx.load(str(qdq))
    quantizer = GivenQuantizer(prepare_int8(onnx.load(str(model))), given)
    feeds = next(samples())
    check_rebuilt(quantizer, given, feeds)  # raises if the rebuilt model computes anything else
    assert set(quantizer.given.units) == quantized_nodes(given)
    kept = quantizer.convert(["scale"])
    made = {o for n in kept.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    scale = next(n for n in kept.graph.node if n.name == "scale")
    assert not made & set(scale.input), "the kept node reads no DequantizeLinear"
    assert {n.name for n in kept.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")} == {
        "conv1",
        "scale",
        "conv2",
    }


def test_the_node_to_take_out_of_a_quantize_static_model_is_found_and_verified(run, tmp_path, outlier, int8_feeds):
    model, qdq = outlier
    before = sha256(qdq)
    out = tmp_path / "answer.onnx"
    r = run(
        "mode=precision", "marker=minimal", f"model={model}", f"quantized_model={qdq}",
        f"data_loader={int8_feeds}.pages", f"output={out}", *CHECK,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert [n["name"] for n in r.summary["kept_nodes"]] == ["scale"] and r.summary["low_precision"] == "int8"
    verified = r.summary["answer_verified"]
    assert verified["check_passed"] is True and {"cpu:disable", "cpu:all"} <= set(verified["verified_on"])
    written = onnx.load(str(out))
    assert (
        has_qdq(written) and "scale" not in quantized_nodes(written) and {"conv1", "conv2"} <= quantized_nodes(written)
    )
    assert sha256(qdq) == before, "the given model is only read"


@pytest.mark.parametrize("which", ["another model", "a float model", "a truncated file"])
def test_a_quantized_model_that_is_no_quantized_model_of_the_model_is_one_line(
    run, tmp_path, outlier, int8_feeds, which
):
    model, qdq = outlier
    if which == "another model":  # the conv outlier model against the outlier model's quantized form
        model = tmp_path / "conv.onnx"
        onnx.save(conv_outlier_model(), model)
        given, words = qdq, "is no quantized version of model="
    elif which == "a float model":
        given, words = model, "holds no QuantizeLinear/DequantizeLinear: it is a float model"
    else:
        given = tmp_path / "truncated.onnx"
        given.write_bytes(qdq.read_bytes()[:200])
        words = "quantized_model="
    out = tmp_path / "answer.onnx"
    r = run(
        "mode=precision", "marker=minimal", f"model={model}", f"quantized_model={given}",
        f"data_loader={int8_feeds}.pages", f"output={out}", *CHECK,
    )  # fmt: skip
    one_line_error(r, words, code=2)
    assert r.summary["checks"] == 0 and not out.exists()


def test_keys_a_given_quantized_model_brings_are_refused_beside_it(run, outlier, int8_feeds):
    model, qdq = outlier
    for key in ("low_precision=int8", "calibration.method=entropy", "quantization.per_channel=false"):
        r = run("mode=precision", "marker=minimal", f"model={model}", f"quantized_model={qdq}", key, *CHECK)
        one_line_error(r, "is not used with quantized_model=", code=2)


def test_fp8_places_float8e4m3fn_qdq_where_tensorrt_runs_fp8_and_keeps_what_the_check_needs(run, tmp_path, int8_feeds):
    """fp8 as TensorRT deploys it: Q/DQ to float8e4m3fn on the input and weight (one scale) of the Convs of more
    than 16 channels, opset 19; the search keeps the node the check needs float, and the answer loads and runs
    on ONNX Runtime's CPU provider."""
    from tests.helpers.int8 import wide_model

    model, out = tmp_path / "wide.onnx", tmp_path / "answer.onnx"
    onnx.save(wide_model(), model)
    r = run(
        "mode=precision", "marker=minimal", "low_precision=float8", f"model={model}",
        f"data_loader={int8_feeds}.pages", f"output={out}", "checker=python",
        "checker.target=tests.helpers.checks.reads_no_dq", "checker.args=[conv2]",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.summary["low_precision"] == "float8" and [n["name"] for n in r.summary["kept_nodes"]] == ["conv2"]
    assert r.summary["total"] == 3, "conv0 (3 input channels) has no fp8 kernel"
    written = onnx.load(str(out))
    assert max(o.version for o in written.opset_import if o.domain in ("", "ai.onnx")) >= 19
    zero_points = {i.name: i.data_type for i in written.graph.initializer if i.name.endswith("_fp8_zero_point")}
    assert zero_points and set(zero_points.values()) == {TensorProto.FLOAT8E4M3FN}
    scales = [i for i in written.graph.initializer if i.name.endswith("_fp8_scale")]
    assert scales and all(not s.dims for s in scales), "one scale per tensor, weights too"
    assert quantized_nodes(written) == {"conv1", "conv3"}
    assert r.summary["answer_verified"]["check_passed"] is True
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(None, next(samples()))[0]).all()


def test_fp8_under_compare_is_verified_on_both_cpu_levels(run, tmp_path, int8_feeds):
    """The compare checker runs fp8 candidates as written (switched feeds) and verifies the answer at the full
    tolerance on both of ONNX Runtime's CPU levels, as int8's."""
    from tests.helpers.int8 import wide_model

    model = tmp_path / "wide.onnx"
    onnx.save(wide_model(), model)
    r = run(
        "mode=precision", "marker=minimal", "low_precision=float8", f"model={model}",
        f"data_loader={int8_feeds}.pages", f"output={tmp_path / 'answer.onnx'}", *CHECK[:2], "checker.rtol=0.1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.summary["kept"] < 3, "fully fp8 is at rel L2 0.06, within 0.1 less the margin"
    verified = r.summary["answer_verified"]
    assert verified["check_passed"] is True and {"cpu:disable", "cpu:all"} <= set(verified["verified_on"])
    assert r.summary.get("switched_checks", 0) >= 1


@pytest.mark.slow  # quantize_static on the classifier, then a search of 201 nodes: about 10 s
def test_quantize_statics_model_of_the_readmes_classifier_is_matched_rebuilt_and_searched(run, tmp_path):
    """Issue 76: ONNX Runtime's ``quantize_static`` with its defaults keeps the classifier at opset 11 (per-tensor
    Q/DQ) and removes 18 Clips and 15 Relus into the Q ranges. The run raised model= to opset 13, whose version
    converter rewrote its Softmax into Shape, Flatten, Softmax and Reshape, and then refused the given model
    ("model='s Shape_564 (Shape) is not in it"). At the given model's opset the two match, the rebuild is bit for bit,
    and the search answers, verified as written."""
    import shutil

    from runner.lowp.given_match import opset_of
    from tests.helpers.models import CLASSIFIER

    model = tmp_path / "cls.onnx"
    shutil.copy(CLASSIFIER, model)
    from onnxruntime.quantization import QuantFormat, quantize_static

    rng = np.random.default_rng(0)
    feeds = [{"x": rng.random((1, 3, 48, 192), dtype=np.float32)} for _ in range(4)]
    qdq = tmp_path / "cls_qdq.onnx"
    quantize_static(str(model), str(qdq), calibration_reader(feeds), quant_format=QuantFormat.QDQ)
    given = onnx.load(str(qdq))
    assert opset_of(given) == 11 and sum(n.op_type in ("Relu", "Clip") for n in given.graph.node) == 0
    quantizer = GivenQuantizer(prepare_int8(onnx.load(str(model)), opset=11, least=11), given)
    check_rebuilt(quantizer, given, feeds[0])
    r = run(
        "mode=precision", "marker=minimal", f"model={model}", f"quantized_model={qdq}",
        "model_input_shapes={x:[1,3,48,192]}", f"output={tmp_path / 'answer.onnx'}", *CHECK,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.summary["answer_verified"]["check_passed"] is True
    assert 0 < r.summary["kept"] < r.summary["total"] == 201
    said = (r.run_dir / "runner.log").read_text()
    assert "its quantizer removed 33 of model='s nodes into the Q/DQ ranges after them (18 Clip, 15 Relu" in said
