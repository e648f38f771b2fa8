"""The output-error ranking: each candidate run whole and compared with the fp32 model at its outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper, numpy_helper

from examples.planted import f32, make_model
from runner.errors import ModelError
from runner.layerwise.output_ranking import output_error, output_error_ranking


def _scaled(a: float, b: float):
    """y = (x * a) * b: two Mul nodes whose constants stand in for each node's low-precision error."""
    nodes = [helper.make_node("Mul", ["x", "a"], ["t"], name="mul_a"), helper.make_node("Mul", ["t", "b"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in (("a", a), ("b", b))]
    return make_model(nodes, [f32("x", [1, 4])], [f32("y", [1, 4])], inits)


def test_the_candidate_whose_outputs_move_most_ranks_first():
    samples = [{"x": np.full((1, 4), k + 1, np.float32)} for k in range(2)]
    candidates = [("small", lambda: _scaled(1.01, 1.0)), ("none", lambda: _scaled(1.0, 1.0))]
    candidates.append(("large", lambda: _scaled(1.0, 1.5)))
    assert output_error_ranking(candidates, _scaled(1.0, 1.0), samples) == ["large", "small", "none"]


def test_a_candidate_that_cannot_run_ranks_first_and_ties_keep_their_order():
    def broken():
        raise ModelError("cannot quantize")

    samples = [{"x": np.ones((1, 4), np.float32)}]
    same = [(name, lambda: _scaled(1.0, 1.0)) for name in ("p", "q")]
    assert output_error_ranking([*same, ("bad", broken)], _scaled(1.0, 1.0), samples) == ["bad", "p", "q"]


@pytest.mark.parametrize(
    "got, want, expected",
    [
        ({"y": np.array([3.0, 4.0])}, {"y": np.array([0.0, 0.0])}, 5.0),  # a zero reference: the error itself
        ({"y": np.array([1.0, 1.0])}, {"y": np.array([1.0, 1.0])}, 0.0),
        ({"y": np.array([1.0, np.nan])}, {"y": np.array([1.0, 1.0])}, math.inf),
        ({"y": np.array([1.0])}, {"y": np.array([1.0, 1.0])}, math.inf),  # a decision output with other rows
        ({}, {"y": np.array([1.0])}, math.inf),
    ],
)
def test_output_error(got, want, expected):
    assert output_error(got, want) == pytest.approx(expected)


def test_output_error_is_relative_over_every_output_together():
    want = {"a": np.array([3.0]), "b": np.array([4.0])}
    assert output_error({"a": np.array([3.0]), "b": np.array([4.5])}, want) == pytest.approx(0.5 / 5.0)


def test_a_long_ranking_says_how_far_it_is(monkeypatch, caplog):
    """A line every ``PROGRESS_S`` seconds (here: every candidate) while the candidates run."""
    import logging

    import runner.layerwise.output_ranking as output_ranking

    monkeypatch.setattr(output_ranking, "PROGRESS_S", 0.0)
    builds = [(k, lambda k=k: _scaled(1.0 + k, 1.0)) for k in range(3)]
    with caplog.at_level(logging.INFO):
        assert output_error_ranking(builds, _scaled(1.0, 1.0), [{"x": np.ones((1, 4), np.float32)}]) == [2, 1, 0]
    assert "Ranking by output error: 2 of 3" in caplog.text


def test_a_switched_model_that_cannot_run_hands_every_candidate_to_its_build(caplog):
    """A switchboard whose run fails (a device out of memory on the real thing; here a switch left unfed) is the
    switchboard's failure, not the candidates': said once, and each candidate is built and ranked as built."""
    import logging

    from runner.lowp.switchboard import Switchboard

    reference = _scaled(1.0, 1.0)
    board = Switchboard(_scaled(1.0, 1.0), {0: "switch__0"}, "board")
    board.model.graph.input.append(helper.make_tensor_value_info("switch__0", 9, []))  # never fed below
    models = {"small": _scaled(1.01, 1.0), "large": _scaled(1.0, 1.5), "none": _scaled(1.0, 1.0)}
    switched = [(name, lambda: (board, {})) for name in models]
    samples = [{"x": np.ones((1, 4), np.float32)}]
    with caplog.at_level(logging.WARNING):
        order = output_error_ranking(switched, reference, samples, built=lambda name: models[name])
    assert order == ["large", "small", "none"]
    assert caplog.text.count("the switched model cannot run") == 1
    assert output_error_ranking(switched, reference, samples) == list(models)  # no builds: each ranks first


def _slow(seconds: float, scale: float):
    """A build that takes ``seconds`` (a candidate's conversion, or a switched model's first session)."""

    def build():
        import time

        time.sleep(seconds)
        return _scaled(scale, 1.0)

    return build


def test_a_ranking_past_its_allowance_stops_after_its_first_runs():
    """A budget's share (``allowance``): 10 runs of 0.1 s cannot fit in 0.3 s; the ranking stops once it has the
    pace of ``PACE_AFTER`` runs, with how far it got, and makes no more runs."""
    from runner.layerwise.output_ranking import PACE_AFTER, RankingAbandoned

    builds = [(k, _slow(0.1, 1.0 + k)) for k in range(10)]
    with pytest.raises(RankingAbandoned) as stopped:
        output_error_ranking(builds, _scaled(1.0, 1.0), [{"x": np.ones((1, 4), np.float32)}], allowance=0.3)
    assert stopped.value.done == PACE_AFTER and stopped.value.total == 10 and stopped.value.seconds < 1.0
    with pytest.raises(RankingAbandoned) as spent:
        output_error_ranking(builds, _scaled(1.0, 1.0), [{"x": np.ones((1, 4), np.float32)}], allowance=0.0)
    assert spent.value.done == 0, "nothing left: no run"


def test_a_ranking_paces_itself_on_the_runs_after_the_first():
    """The first run pays once for what every later one shares (the switched model's session: 7 s, then 0.15 s
    a run for a 0.5B decoder on an H200): 0.4 s then 12 runs of 10 ms fit in 1.5 s, though the first three runs'
    mean pace (0.14 s) would have projected 2 s."""
    builds = [(0, _slow(0.4, 1.0))] + [(k, _slow(0.01, 1.0 + k)) for k in range(1, 13)]
    order = output_error_ranking(builds, _scaled(1.0, 1.0), [{"x": np.ones((1, 4), np.float32)}], allowance=1.5)
    assert order[0] == 12 and order[-1] == 0
