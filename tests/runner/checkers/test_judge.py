"""The compare checker's judgement of one sample (``runner.checkers.compare.judge``): the failing verdict's
reason, a shape change of a data-dependent output said as a decision flip, and a failure within the noise floor."""

from __future__ import annotations

import numpy as np

from runner.checkers.compare.judge import Judge
from runner.checkers.compare.tolerance import Tolerances
from runner.graph.decisions import Decision


def _golden():
    return {"a": np.ones(4, np.float32), "b": np.zeros(4, np.float32), "boxes": np.zeros((3, 4), np.float32)}


def test_a_failing_sample_names_its_first_problem_and_counts_the_rest():
    judge = Judge(Tolerances(atol=0.01, rtol=0.0), None)
    got = {"a": np.full(4, 2, np.float32), "b": np.full(4, 5, np.float32)}
    judged = judge.judge(got, _golden(), judge.rule, "Iteration 3")
    assert not judged.passed and judged.arrays_failed and len(judged.problems) == 2
    verdict = judged.failed(sample=1, switched=False)
    assert not verdict.passed and verdict.reason.startswith("sample 1: a") and verdict.reason.endswith("(+1 more)")
    assert verdict.sample == 1 and verdict.details == {} and set(verdict.outputs or {}) == {"a", "b"}
    passed, stats, first = judge.at_full_tolerance({"a": np.ones(4, np.float32)}, _golden())
    assert passed and first == "" and stats == {"a": 0.0}


def test_a_shape_change_of_a_data_dependent_output_is_a_decision_flip():
    judge = Judge(Tolerances(), None)
    judge.decisions = {"boxes": Decision("nms", "NonMaxSuppression", ["scores"])}
    judged = judge.judge({"boxes": np.zeros((5, 4), np.float32)}, _golden(), judge.rule, "Iteration 1")
    assert not judged.passed
    assert judged.problems[0].startswith("boxes: decision flip, shape")
    assert "NonMaxSuppression nms" in judged.problems[0] and "checker.outputs=[scores]" in judged.problems[0]


def test_a_failure_within_the_noise_floor_passes_with_the_floor_noted():
    judge = Judge(Tolerances(atol=0.0, rtol=0.0), None)
    judged = judge.judge({"a": np.full(4, 1.0001, np.float32)}, _golden(), judge.rule, "Iteration 2")
    assert not judged.passed
    judged.within_noise({"a": 1e-3}, "Iteration 2")
    assert judged.passed and judged.problems == []
    assert judged.stats["a"]["passed"] is True and judged.stats["a"]["noise_floor"] == 1e-3
