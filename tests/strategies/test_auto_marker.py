"""marker=auto: linear for a search of few positions or where walking every one is cheap by the measured checks,
else bisect; both give the same answer on a monotone check."""

from __future__ import annotations

import onnx

from runner.check_times import CheckTimes
from strategies.auto_marker import LINEAR_UP_TO, AutoMarker
from strategies.bisect import BisectMarker
from strategies.linear import LinearMarker
from tests.helpers.models import chain_model


def _times(*seconds: float) -> CheckTimes:
    times = CheckTimes()
    for s in seconds:
        times.record(s)
    times.record(None)  # a replayed verdict: no check here
    return times


def test_the_choice_by_size_and_measured_cost():
    assert type(AutoMarker(LINEAR_UP_TO)) is LinearMarker, "few positions: walk them"
    assert type(AutoMarker(100)) is BisectMarker, "no check measured: bisect"
    assert type(AutoMarker(100, _times(0.1, 0.2, 5.0))) is LinearMarker, "100 x 0.2 s <= 30 s"
    assert type(AutoMarker(100, _times(1.0, 2.0))) is BisectMarker, "100 x 1.5 s > 30 s"
    assert type(AutoMarker(100, _times(1.0), linear_budget_s=200)) is LinearMarker
    marker = AutoMarker(100, _times(2.0))
    assert (marker.lo, marker.hi) == (0, 100) and marker.next() == 50


def test_a_reduce_says_its_choice_and_finds_the_same_node(run, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain_model(40), path)
    args = ["mode=reduce", f"model={path}", "checker=python", "checker.target=tests.helpers.crashing.check"]
    auto = run(*args, "marker=auto", f"output={tmp_path / 'auto.onnx'}")
    bisect = run(*args, "marker=bisect", f"output={tmp_path / 'bisect.onnx'}")
    assert auto.returncode == 0 and bisect.returncode == 0, auto.stderr[-2000:]
    said = [line for line in (auto.run_dir / "runner.log").read_text().splitlines() if "marker=auto:" in line]
    assert said and "linear" in said[0] and "s a check" in said[0], "the gates' checks measured a check first"
    assert auto.summary["reduced_nodes"] == bisect.summary["reduced_nodes"]
    assert auto.summary["checks"] > bisect.summary["checks"], "linear walks the positions"
