"""mode=layerwise on int8: an fp32 model quantized with the run's calibration (checker.low_precision=int8), and a
QDQ model from ONNX Runtime's quantize_static against its float original; tensors matched through Q/DQ pairs."""

from __future__ import annotations

import csv

import onnx
import pytest

from runner.graph.qdq import compute_nodes
from runner.lowp.convert import name_nodes
from tests.helpers.cli import one_line_error
from tests.helpers.int8 import calibration_reader, introduced_share, outlier_model, samples
from tests.helpers.models import CLASSIFIER, need


def _layerwise_int8(model, int8_feeds):
    """The overrides of a layerwise int8 run of ``model`` on the loader's pages, judged by rel L2."""
    return [
        "mode=layerwise",
        f"model={model}",
        "checker.low_precision=int8",
        f"data_loader={int8_feeds}.pages",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
        "layerwise.plot=false",
    ]


def test_the_planted_outlier_is_the_top_introduced_node_and_its_pair_the_worst(run, tmp_path, int8_feeds):
    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(), model)
    # the CPU placement quantizes the Mul that reads the outlier
    r = run(*_layerwise_int8(model, int8_feeds), "quantization.placement=onnxruntime")
    assert r.returncode == 0, r.stderr[-3000:]
    s = r.summary
    share, _rows = introduced_share(s, r.run_dir / "layerwise.csv")
    assert share == 1.0 and s["nodes"] == 3
    assert s["top_introduced"][0]["node"] == "scale" and s["first_divergence"]["node"] == "scale"
    assert s["top_introduced"][0]["introduced"]["sqnr_db"] < 10  # the rounded channels, times 10
    q = s["quantization"]
    assert q["activations"] == 3 and q["weights"] >= 3
    assert q["worst_activations"][0]["tensor"] == "t" and q["worst_activations"][0]["readers"] == ["scale"]
    with open(r.run_dir / "quantization.csv") as f:
        pairs = list(csv.DictReader(f))
    assert {p["tensor"] for p in pairs} >= {"x", "t", "u", "w1", "s", "w2"}
    assert s["calibration"]["samples"] == 4 and s["target"] == "onnxruntime (int8)"


def test_tensorrt_placement_names_the_conv_that_reads_the_outlier(run, tmp_path, int8_feeds):
    """The default placement quantizes Conv inputs and weights only: the top introduced error is conv2's,
    which reads the tensor whose outlier channel sets its one scale."""
    from tests.helpers.int8 import conv_outlier_model

    model = tmp_path / "conv_outlier.onnx"
    onnx.save(conv_outlier_model(), model)
    r = run(*_layerwise_int8(model, int8_feeds))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.summary["top_introduced"][0]["node"] == "conv2"
    assert r.summary["quantization"]["worst_activations"][0]["tensor"] == "t"


def test_a_qdq_model_needs_its_float_original(run, tmp_path, int8_feeds):
    from onnxruntime.quantization import QuantFormat, quantize_static

    model = tmp_path / "outlier.onnx"
    onnx.save(outlier_model(opset=13), model)

    qdq = tmp_path / "outlier_qdq.onnx"
    quantize_static(str(model), str(qdq), calibration_reader(samples()), quant_format=QuantFormat.QDQ, per_channel=True)
    r = run("mode=layerwise", f"model={qdq}", f"data_loader={int8_feeds}.pages")
    one_line_error(r, "QDQ", "reference_model=", code=2)
    r = run(
        "mode=layerwise",
        f"model={qdq}",
        f"reference_model={model}",
        f"data_loader={int8_feeds}.pages",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
        "layerwise.plot=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    share, _ = introduced_share(r.summary, r.run_dir / "layerwise.csv")
    assert share == 1.0 and r.summary["top_introduced"][0]["node"] == "scale"


@pytest.mark.slow
def test_classifier_quantized_by_quantize_static_against_its_original(run, tmp_path):
    """ONNX Runtime's own QDQ output for the real classifier (547 compute nodes before): the introduced error of
    at least 95% of its compute nodes, where matching by name alone found 1."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    from examples.text_pages import classifier_lines
    from runner.lowp.quantize import prepare_int8

    fp32 = tmp_path / "cls_fp32.onnx"
    onnx.save(prepare_int8(onnx.load(str(need(CLASSIFIER)))), fp32)

    qdq = tmp_path / "cls_qdq.onnx"
    quantize_static(
        str(fp32), str(qdq), calibration_reader(classifier_lines()), quant_format=QuantFormat.QDQ, per_channel=True
    )
    r = run(
        "mode=layerwise",
        f"model={qdq}",
        f"reference_model={fp32}",
        "data_loader=examples.text_pages.classifier_lines",
        "layerwise.plot=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    share, _ = introduced_share(r.summary, r.run_dir / "layerwise.csv")
    compute = len(compute_nodes(name_nodes(onnx.load(str(qdq)))))
    assert r.summary["nodes"] == compute and share >= 0.95
    assert r.summary["quantization"]["pairs"] > 100
