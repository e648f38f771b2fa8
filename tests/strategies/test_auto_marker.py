"""marker=auto: the marker with the shorter expected wall, a candidate's whole cost measured by the run (linear
only where its expected checks are no more than bisect's); both give the same answer on a monotone check."""

from __future__ import annotations

import onnx

from runner.check_times import CheckTimes
from strategies.auto_marker import AutoMarker, expected_checks
from strategies.bisect import BisectMarker
from strategies.linear import LinearMarker
from tests.helpers.checks import reduce_args
from tests.helpers.models import CLASSIFIER, chain_model


def _times(*seconds: float) -> CheckTimes:
    times = CheckTimes()
    for s in seconds:
        times.record(s / 100)  # a fast check
        times.record_round(s, 1)  # in a candidate that costs s whole
    times.record(None)  # a replayed verdict: no check here
    times.record_round(3.0, 0)  # a round of reused verdicts: no measure
    return times


def test_the_choice_never_takes_the_longer_expected_wall(caplog):
    caplog.set_level("INFO")
    for count in range(1, 300):
        walk, halve = expected_checks(count)
        chosen = type(AutoMarker(count, _times(0.1, 0.2)))
        assert chosen is (LinearMarker if walk <= halve else BisectMarker), count
    assert type(AutoMarker(5)) is LinearMarker and type(AutoMarker(6)) is BisectMarker
    caplog.clear()
    marker = AutoMarker(163, _times(0.1, 0.11, 0.09))
    assert (marker.lo, marker.hi) == (0, 163) and marker.next() == 81
    line = caplog.messages[-1]
    assert "bisect (163 positions: linear ~82 checks x 0.1 s = 8.2 s, bisect 8 = 0.8 s" in line, line
    assert "a candidate costs 0.1 s whole, its check 0.001 s" in line


def test_a_reduce_says_its_choice_and_finds_the_same_node(run, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain_model(40), path)
    args = ["mode=reduce", f"model={path}", "checker=python", "checker.target=tests.helpers.crashing.check"]
    auto = run(*args, "marker=auto", f"output={tmp_path / 'auto.onnx'}")
    bisect = run(*args, "marker=bisect", f"output={tmp_path / 'bisect.onnx'}")
    assert auto.returncode == 0 and bisect.returncode == 0, auto.stderr[-2000:]
    said = [line for line in (auto.run_dir / "runner.log").read_text().splitlines() if "marker=auto:" in line]
    assert said and "bisect" in said[0] and "s whole" in said[0], "the gates' checks measured a candidate first"
    assert auto.summary["reduced_nodes"] == bisect.summary["reduced_nodes"]
    assert auto.summary["checks"] == bisect.summary["checks"]


def test_the_readme_classifier_with_a_fast_check_takes_bisects_checks(run, tmp_path):
    """Issue 78: a check of a millisecond on the README's classifier made ``auto`` walk 163 positions (17.2 s);
    judged by a candidate's whole cost it bisects: at most 15 checks, the node found."""
    r = run(*reduce_args(CLASSIFIER, "HardSigmoid@2"), "marker=auto", f"output={tmp_path / 'auto.onnx'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.summary["checks"] <= 15
    assert "HardSigmoid@2" in str(r.summary["reduced_nodes"])
