"""Models whose outputs are decisions (issue 35): data-dependent output shapes found at load, a length
change named a decision flip with the tensors to compare instead, ``checker.outputs`` on any tensors of
the model, ``checker.detections``, and precision's all-fp32 gate run as the golden values were made."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from examples.planted import threshold_detector
from runner.checkers.compare.detections import DetectionRule, judge
from runner.graph.decisions import data_dependent_outputs


def _files(tmp_path, threshold=0.5):
    model, x = threshold_detector(threshold)
    path = tmp_path / f"det_{threshold}.onnx"
    onnx.save(model, path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=x)
    return path, inputs


def test_outputs_of_data_dependent_shape_are_found_with_the_tensors_before_the_decision():
    model, _ = threshold_detector()
    found = data_dependent_outputs(model, {"x": [1, 3, 8, 8]})
    assert sorted(found) == ["boxes", "scores"]
    assert found["boxes"].op == "NonZero" and set(found["boxes"].inputs) == {"all_scores", "decoded"}
    assert "checker.outputs=[all_scores,decoded]" in found["boxes"].hint()


def _golden(run, tmp_path, path, inputs):
    golden = tmp_path / "golden.npz"
    r = run("mode=repeat", "until=1", f"model={path}", "checker=compare", f"inputs={inputs}", f"save_golden={golden}")
    assert r.returncode == 0, r.stderr[-2000:]
    return golden


def _against_golden(run, tmp_path):
    """The run of a model thresholded at 0.45 (32 boxes) against the golden values of one at 0.5 (31)."""
    path, inputs = _files(tmp_path)
    golden = _golden(run, tmp_path, path, inputs)
    lower, _ = _files(tmp_path, 0.45)
    return ["mode=repeat", "until=1", f"model={lower}", "checker=compare", f"inputs={inputs}", f"golden={golden}"]


def test_a_length_change_is_a_decision_flip_with_a_one_line_hint(run, tmp_path):
    """The golden model keeps 31 boxes; a threshold of 0.45 keeps 32: the arrays cannot be compared, and the
    verdict says why and what to compare instead."""
    r = run(*_against_golden(run, tmp_path))
    assert r.returncode == 0 and r.summary["bad"] == 1, r.stderr[-2000:]
    reason = r.replay["iterations"][0]["reason"]
    assert "decision flip" in reason and "shape [32, 4] != golden [31, 4]" in reason
    assert "checker.outputs=[all_scores,decoded]" in reason


@pytest.mark.slow  # three runs: about the 1.5 s of an unmarked test
def test_checker_outputs_compares_the_tensors_before_the_decision(run, tmp_path):
    base = _against_golden(run, tmp_path)
    r = run(*base, "checker.outputs=[all_scores,decoded]")
    assert r.returncode == 0 and r.summary["good"] == 1, r.stderr[-2000:]
    outputs = r.replay["iterations"][0]["details"]["outputs"]
    assert sorted(outputs) == ["all_scores", "decoded"] and all(o["max_abs"] < 1e-5 for o in outputs.values())
    r = run(*base, "checker.exclude_outputs=[boxes,scores]", "checker.outputs=[all_scores]")
    assert r.summary["good"] == 1
    bad = run(*base, "checker.outputs=[no_such_tensor]")
    assert bad.returncode == 2 and "no_such_tensor" in bad.stderr


@pytest.mark.slow  # two runs: about the 1.5 s of an unmarked test
def test_detections_are_matched_by_iou_and_an_extra_box_counts(run, tmp_path):
    base = _against_golden(run, tmp_path)
    strict = run(*base, "checker.detections={boxes: boxes, scores: scores}")
    assert strict.summary["bad"] == 1, strict.stderr[-2000:]
    details = strict.replay["iterations"][0]["details"]["detections"]
    assert details["matched"] == 31 and details["extra"] == 1 and details["missed"] == 0
    assert "1 extra" in strict.replay["iterations"][0]["reason"]
    one = run(*base, "checker.detections={boxes: boxes, scores: scores, max_unmatched: 1}")
    assert one.summary["good"] == 1
    above = run(*base, "checker.detections={boxes: boxes, scores: scores, min_score: 0.5}")
    assert above.summary["good"] == 1, "the extra box scores under 0.5: below the threshold a deployment uses"


def test_detection_matching_by_label_iou_and_score():
    golden = {"b": np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32), "s": np.array([0.9, 0.8]), "l": [1, 2]}
    got = {"b": np.array([[21, 20, 31, 30], [0, 1, 10, 11]], np.float32), "s": np.array([0.79, 0.92]), "l": [2, 1]}
    ok, facts, _ = judge(got, golden, DetectionRule("b", "s", "l"))
    assert ok and facts["matched"] == 2 and facts["min_iou"] > 0.8
    relabeled = {**got, "l": [1, 1]}
    ok, facts, problem = judge(relabeled, golden, DetectionRule("b", "s", "l"))
    assert not ok and facts["missed"] == 1 and facts["extra"] == 1 and "unmatched" in problem
    ok, _, problem = judge(got, golden, DetectionRule("b", "s", "l", score_atol=0.01))
    assert not ok and "score differs" in problem


def test_the_all_fp32_gate_runs_the_model_as_its_golden_values_were_made(run, tmp_path):
    """Issue 35: the all-kept candidate re-fused in fp32 flipped one box of an SSD's NMS and the first gate
    failed. It is now the model as given, run as the golden values were made: it gives them back exactly."""
    path, inputs = _files(tmp_path)
    r = run(
        "mode=precision",
        "marker=minimal",
        f"model={path}",
        f"inputs={inputs}",
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.detections={boxes: boxes, scores: scores}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.replay["iterations"][0]
    assert "the model as given" in first["label"] and first["passed"]
    assert first["details"]["detections"]["max_score_diff"] == 0 and first["details"]["detections"]["min_iou"] == 1
    assert r.summary["answer_verified"]["passed"]
    assert json.dumps(r.summary)  # the detection facts are JSON


def test_a_box_that_overflowed_matches_nothing_and_warns_nothing():
    """fp16 overflow makes a box's coordinates inf (inf - inf is NaN): IoU 0, no RuntimeWarning."""
    import warnings

    from runner.checkers.compare.detections import iou_matrix

    golden = np.array([[0.0, 0.0, 10.0, 10.0]])
    got = np.array([[np.inf, 0.0, np.inf, 10.0], [0.0, 0.0, np.inf, 10.0], [0.0, 0.0, 10.0, 10.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ious = iou_matrix(golden, got)
    assert ious.tolist() == [[0.0, 0.0, 1.0]]
