"""The lifecycle's state sequence on real runs (a real check command, a real replay file)."""

from __future__ import annotations

import sys

import pytest

from runner.candidates import Candidate
from runner.checkers.command import CommandChecker
from runner.errors import ModelError, NothingToDoError
from runner.executors.local import LocalExecutor
from runner.files.artifacts import ArtifactSorter
from runner.files.replay import Replay
from statemachine.lifecycle import STATES, Lifecycle
from strategies.base import Strategy
from strategies.repeat import RepeatStrategy
from strategies.until import Until


def _lifecycle(tmp_path, strategy, code=0):
    checker = CommandChecker.of(f"{sys.executable} -c 'import sys; sys.exit({code})'")
    replay = Replay(tmp_path / "replay.json", "repeat")
    return Lifecycle(strategy, checker, ArtifactSorter([], tmp_path / "art"), replay, tmp_path / "it")


def test_state_sequence_of_a_repeat_run(tmp_path):
    lc = _lifecycle(tmp_path, RepeatStrategy(Until(count=2)))
    lc.run()
    cycle = ["generate", "check", "sort", "advance"]
    assert lc.history == ["ready", *cycle, *cycle, "generate", "stopped"]
    assert lc.checks == 2 and lc.iteration == 2


def test_reused_verdicts_skip_check_and_sort(tmp_path):
    first = _lifecycle(tmp_path, RepeatStrategy(Until(count=2)))
    first.run()
    replay = Replay(tmp_path / "second.json", "repeat", load_path=tmp_path / "replay.json")
    checker = CommandChecker.of(f"{sys.executable} -c 'import sys; sys.exit(0)'")
    lc = Lifecycle(
        RepeatStrategy(Until(count=3)), checker, ArtifactSorter([], tmp_path / "art"), replay, tmp_path / "it"
    )
    lc.run()
    # a known verdict takes the conditional generate -> advance transition: no check state, no sort
    assert lc.history == [
        "ready",
        "generate",
        "advance",
        "generate",
        "advance",
        "generate",
        "check",
        "sort",
        "advance",
        "generate",
        "stopped",
    ]
    assert lc.checks == 1 and lc.reused_count == 2


class _Refuses(Strategy):
    def next_candidate(self):
        return Candidate("k", "only")

    def take_verdict(self, candidate, verdict):
        raise NothingToDoError("nothing to do")


def test_error_in_a_callback_ends_in_failed(tmp_path):
    lc = _lifecycle(tmp_path, _Refuses())
    with pytest.raises(NothingToDoError):
        lc.run()
    assert lc.state == "failed"
    assert lc.history[-1] == "failed" and set(lc.history) <= set(STATES)


class _GuessesBadly(RepeatStrategy):
    """Repeat runs whose look-ahead fails: a guess that cannot be built."""

    def lookahead(self, k):
        def build() -> bool:
            raise ModelError("this guess cannot be built")

        return [("never", build)]


def test_a_failing_look_ahead_does_not_change_the_run(tmp_path):
    checker = CommandChecker.of(f"{sys.executable} -c 'import time; time.sleep(0.2)'")
    replay = Replay(tmp_path / "replay.json", "repeat")
    executor = LocalExecutor(workers=2)
    lc = Lifecycle(
        _GuessesBadly(Until(count=4)),
        checker,
        ArtifactSorter([], tmp_path / "art"),
        replay,
        tmp_path / "it",
        None,
        None,
        executor,
    )
    try:
        assert lc.run() == "stopped"
    finally:
        executor.close()
    assert lc.taken == 4 and lc.passes == 4 and lc.rounds == 2
