"""Look-ahead in the ONNX searches: while a round is checked, the models of the next round's
possible candidates are built; the next round takes the ones it holds and drops the others."""

from __future__ import annotations

import strategies.ahead as ahead
from runner.candidates import Verdict
from strategies.bisect import BisectMarker
from strategies.reduce import ReduceStrategy
from tests.helpers.models import chain_model, graph_index


def _reduce(tmp_path, n=16) -> ReduceStrategy:
    return ReduceStrategy(graph_index(chain_model(n)), BisectMarker, output=tmp_path / "r.onnx")


def _fails_with(name):
    """A check that fails while node ``name`` is in the candidate (monotone)."""

    def verdict(candidate) -> Verdict:
        return Verdict(passed=name not in {n.name for n in candidate.payload().graph.node})

    return verdict


def test_the_next_round_takes_the_models_built_for_it_and_drops_the_rest(tmp_path, monkeypatch):
    strategy = _reduce(tmp_path)
    check = _fails_with("n9")
    built = []
    real = strategy.model_for
    monkeypatch.setattr(strategy, "model_for", lambda units: built.append(units) or real(units))
    candidates = strategy.next_round(3)
    taken_ahead = 0
    while candidates:
        verdicts = [check(c) for c in candidates]
        work = strategy.lookahead(3)  # what the lifecycle does while the round's checks run
        guesses = {key for key, build in work if build()}
        strategy.take_round(candidates, verdicts)
        candidates = strategy.next_round(3)
        assert len(strategy.ahead) == 0  # the other outcomes' models are dropped
        if work:
            searched = {c.key for c in candidates if c.reuse}  # not the written answer's check
            assert searched <= guesses  # the round is one of the outcomes guessed
            before = len(built)
            for candidate in candidates:
                candidate.payload()
            assert len(built) == before  # and its models are not built again
            taken_ahead += len(candidates)
    assert taken_ahead >= 6
    assert [d["name"] for d in strategy.describe(strategy.final)] == ["n9"]


def test_build_ahead_stops_when_the_models_held_reach_the_budget(tmp_path, monkeypatch):
    strategy = _reduce(tmp_path)
    strategy.next_round(2)
    units = frozenset(strategy.index.units)
    monkeypatch.setattr(ahead, "AHEAD_BYTES", strategy.model_for(units).ByteSize() + 1)
    assert strategy.build_ahead(units)  # fits
    assert not strategy.build_ahead(frozenset(list(units)[:3]))  # no room left
    assert strategy.build_ahead(units)  # held already


def test_a_model_taken_frees_its_bytes_and_large_weights_build_nothing_ahead(monkeypatch):
    model = chain_model(8)
    size = model.ByteSize()
    monkeypatch.setattr(ahead, "AHEAD_BYTES", size + 1)
    held = ahead.AheadModels()
    assert held.build(("", frozenset({1})), lambda: model) and len(held) == 1
    assert not held.build(("", frozenset({2})), lambda: model)  # no room beside the first
    assert held.take(("", frozenset({1}))) is model and held.take(("", frozenset({1}))) is None
    assert held.build(("", frozenset({2})), lambda: model)  # the room it left
    held.clear()
    held.weight_bytes = ahead.AHEAD_LARGE
    built = []
    assert not held.build(("", frozenset({3})), lambda: built.append(1) or model) and not built
