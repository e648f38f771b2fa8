"""``low_precision=int8 quantization.float_precision=float16``: int8 with the rest in fp16, as TensorRT's
``--int8 --fp16`` builds it: the fp16 stage's fp32 nodes, then the int8 search in that arithmetic."""

from __future__ import annotations

import collections

import onnx
import pytest
from onnx import TensorProto

from tests.helpers.cli import one_line_error
from tests.helpers.int8 import detector_int8, fp16_and_int8_model
from tests.helpers.models import DETECTOR, need

FP16_REST = ["low_precision=int8", "quantization.float_precision=float16"]
CHECK = ["checker=compare", "checker.backend=fp16_emulation", "checker.check_error_stat=rel_l2", "checker.rtol=0.05"]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "fp16_and_int8.onnx"
    onnx.save(fp16_and_int8_model(), path)
    return path


def _scale_types(model: onnx.ModelProto) -> collections.Counter:
    inits = {i.name: i.data_type for i in model.graph.initializer}
    return collections.Counter((n.op_type, inits[n.input[1]]) for n in model.graph.node if "Linear" in n.op_type)


@pytest.mark.slow  # about 1.4 s: at the 1.5 s of an unmarked test
def test_int8_answer_with_its_fp16_and_fp32_nodes(run, tmp_path, model, int8_feeds):
    """int8 breaks at conv2, fp16 at shrink: conv2 stays out of int8 in fp16, shrink in fp32, conv1 int8; the
    model written holds fp16 Q/DQ at opset 19 and passes as written."""
    out = tmp_path / "mixed.onnx"
    r = run(
        "mode=precision",
        "marker=minimal",
        f"model={model}",
        f"data_loader={int8_feeds}.pages",
        *FP16_REST,
        *CHECK,
        f"output={out}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s = r.summary
    assert [n["name"] for n in s["kept_nodes"]] == ["conv2"] and s["kept"] == 1 and s["total"] == 2
    assert s["float_precision"] == "float16"
    assert [n["name"] for n in s["fp16_nodes"]] == ["conv2"]
    assert [n["name"] for n in s["fp32_nodes"]] == ["shrink"]
    assert s["answer_verified"]["check_passed"] is True
    written = onnx.load(out)
    assert max(o.version for o in written.opset_import if o.domain in ("", "ai.onnx")) == 19
    # conv1 is int8: its input Q/DQ reads the fp32 graph input (fp32 scale), its weight DQ feeds the fp16 conv
    assert _scale_types(written) == {
        ("QuantizeLinear", TensorProto.FLOAT): 1,
        ("DequantizeLinear", TensorProto.FLOAT16): 2,
    }
    types = {i.name: i.data_type for i in written.graph.initializer}
    assert types["d"] == TensorProto.FLOAT, "shrink's divisor stays fp32 (fp16 clips it to 65504)"
    conv2 = next(n for n in written.graph.node if n.name == "conv2")
    assert types[conv2.input[1]] == TensorProto.FLOAT16, "conv2 runs in fp16, its weight float (no DQ)"
    log = (r.run_dir / "runner.log").read_text()
    assert "every float node in float16, none in int8" in log.split("-> FAIL")[0], "the all-fp16 check comes first"


def test_a_stage_that_passes_at_once_costs_one_check(run, tmp_path, model, int8_feeds):
    """With a tolerance int8 and fp16 both meet, each stage is settled by its first check: the model as
    given, all fp16, fully int8, the answer."""
    loose = [c for c in CHECK if not c.startswith("checker.rtol")] + ["checker.rtol=3"]
    r = run("mode=precision", "marker=minimal", f"model={model}", f"data_loader={int8_feeds}.pages", *FP16_REST, *loose)
    assert r.returncode == 0, r.stderr[-2000:]
    s = r.summary
    assert s["kept"] == 0 and s["fp32_nodes"] == [] and s["checks"] == 4


@pytest.mark.slow  # two runs
def test_a_resume_checks_nothing_its_replay_holds(run, tmp_path, model, int8_feeds):
    """Both stages' verdicts are keyed apart: a resumed run reuses every one and checks only the answer."""
    argv = ["mode=precision", "marker=minimal", f"model={model}", f"data_loader={int8_feeds}.pages", *FP16_REST, *CHECK]
    first = run(*argv)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run(*argv, f"replay.load={first.run_dir / 'replay.json'}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.summary["fp32_nodes"] == first.summary["fp32_nodes"]
    assert again.summary["kept_nodes"] == first.summary["kept_nodes"]
    assert again.summary["reused"] == first.summary["checks"] - 1  # all but the written answer's check


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["mode=precision", "marker=minimal", *CHECK, "low_precision=int8", "quantization.float_precision=bfloat16"],
            "quantization.float_precision=bfloat16",
        ),
        (
            ["mode=layerwise", "checker.low_precision=int8", "quantization.float_precision=float16"],
            "applies to mode=precision",
        ),
        (
            ["mode=precision", "marker=minimal", *CHECK, *FP16_REST, "quantization.placement=onnxruntime"],
            "use quantization.placement=tensorrt",
        ),
    ],
)
def test_unsupported_float_precision_is_a_one_line_error(run, model, int8_feeds, argv, says):
    one_line_error(run(*argv, f"model={model}", f"data_loader={int8_feeds}.pages"), says)


@pytest.mark.slow
def test_detector_int8_with_fp16_keeps_the_batchnorm_fp32(run, tmp_path):
    """The README's int8 run with the rest in fp16: the BatchNormalization whose running variance (9.8e7) fp16
    clips stays fp32; every node TensorRT quantizes is int8, the rest fp16, and the model written passes the
    text map check as written."""
    from examples.text_pages import text_map_iou

    model = need(DETECTOR)
    out = tmp_path / "det_int8_fp16.onnx"
    r = detector_int8(run, model, out, "quantization.float_precision=float16")
    assert r.returncode == 0, r.stderr[-2000:]
    s = r.summary
    assert s["kept"] == 0 and [n["name"] for n in s["fp32_nodes"]] == ["p2o.BatchNormalization.1"]
    assert s["answer_verified"]["check_passed"] is True and s["checks"] <= 6
    assert text_map_iou(str(out), str(model))
    scales = _scale_types(onnx.load(out))
    assert scales[("DequantizeLinear", TensorProto.FLOAT16)] >= 200, "Q/DQ typed fp16 against the fp16 nodes"


@pytest.mark.parametrize(
    "extra",
    [
        ["marker=bisect", "direction=ranked"],
        ["marker=linear", "direction=reverse"],
        ["marker=minimal", "executor=local", "executor.workers=3"],
    ],
)
def test_other_markers_and_parallel_rounds_find_the_same_answer(run, model, int8_feeds, extra):
    """Both stages under a prefix marker (ranked, or from the outputs) and under rounds of several checks."""
    r = run("mode=precision", f"model={model}", f"data_loader={int8_feeds}.pages", *FP16_REST, *CHECK, *extra)
    assert r.returncode == 0, r.stderr[-2000:]
    s = r.summary
    assert [n["name"] for n in s["kept_nodes"]] == ["conv2"] and [n["name"] for n in s["fp32_nodes"]] == ["shrink"]
