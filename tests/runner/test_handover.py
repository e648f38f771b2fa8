"""``executor=processes`` hands its checks to the ready workers only when the checks left would take
longer in the runner than the hand-over costs (``runner.executors.handover``)."""

from __future__ import annotations

import logging
import time

import pytest

from runner.errors import ConfigError
from runner.executors.handover import HandOver


def test_an_unknown_estimate_or_ready_workers_before_any_check_here_hand_over():
    unknown, fresh, slow = HandOver(2), HandOver(2), HandOver(2)
    unknown.checked_here(0.1)
    unknown.expect(None, ready=True)
    fresh.expect(3, ready=False)
    assert unknown.wanted.is_set() and not fresh.wanted.is_set(), "nothing is decided before the workers are up"
    fresh.expect(3, ready=True)
    assert fresh.wanted.is_set()
    slow.ready()  # the workers came up while the first checks here still ran
    assert slow.wanted.is_set()


def test_the_decision_waits_for_the_workers_and_takes_the_latest_estimate(caplog):
    handover = HandOver(2, cost_s=2.0)
    for seconds in (0.3, 0.4, 0.5):
        handover.checked_here(seconds)
    handover.expect(20, ready=False)  # 4 s here, but the workers are not up yet
    assert not handover.wanted.is_set()
    with caplog.at_level(logging.INFO, logger="runner.executors.handover"):
        handover.expect(8, ready=False)  # 8 checks of 0.4 s, 2 at once: 1.6 s here
        handover.ready()
        handover.expect(6, ready=True)
    assert not handover.wanted.is_set()
    assert sum("less than handing them over costs" in m for m in caplog.messages) == 1
    handover.expect(11, ready=True)  # 2.2 s here
    assert handover.wanted.is_set()


def test_workers_start_once_the_work_left_would_outlast_their_start_up(caplog):
    """start=auto: nothing measured, nothing started; cheap jobs and checks never start the workers,
    dear ones do (left > start_s + cost_s, ``lanes`` at a time)."""
    cheap, dear = HandOver(2, cost_s=3.0, start_s=5.0), HandOver(2, cost_s=3.0, start_s=5.0)
    for handover in (cheap, dear):
        assert not handover.launch.is_set() and handover.left_s(12) is None
    cheap.expect(12, ready=False)  # precision's estimate before its ranking
    cheap.job_here(0.7, 8)  # the first job here pays for CUDA: (8 + 12) * 0.7 / 2 = 7 s, under 2 x 8 s
    cheap.job_here(0.1, 7)
    cheap.job_here(0.05, 6)  # 6 jobs at the median 0.1 s and 12 checks at the dearest job's 0.7 s: 4.5 s
    assert not cheap.launch.is_set() and cheap.left_s(12) == pytest.approx((6 * 0.1 + 12 * 0.7) / 2)
    cheap.jobs_ended()
    cheap.expect(12, ready=False)  # 12 checks at a job's pace until one ran here: 3 s
    for _ in range(12):
        cheap.checked_here(0.3)
        cheap.expect(11, ready=False)
    assert not cheap.launch.is_set() and cheap.left_s(11) == pytest.approx(11 * 0.3 / 2)
    with caplog.at_level(logging.INFO, logger="runner.executors.handover"):
        dear.job_here(3.0, 8)  # the first job: 8 jobs of 3 s left, 12 s here, not over 16 s
        assert not dear.launch.is_set()
        dear.job_here(3.0, 7)
        dear.job_here(3.0, 6)  # 9 s here
    assert dear.launch.is_set() and not dear.wanted.is_set(), "started, not yet connected"
    assert [m for m in caplog.messages if "they start" in m] == [
        "The work left would take about 9 s here, more than the workers' start-up: they start"
    ]
    ranked = HandOver(2)
    ranked.expect(12, ready=False)
    ranked.job_here(3.0, 8)  # (8 + 12) * 3 / 2 = 30 s: over twice the start-up and hand-over
    assert ranked.launch.is_set()


def test_checks_alone_start_the_workers_and_an_unknown_estimate_starts_them_at_once():
    reduce, unknown, now = HandOver(2), HandOver(2), HandOver(2, start="now")
    reduce.expect(12, ready=False)
    assert not reduce.launch.is_set(), "no check measured yet"
    reduce.checked_here(1.5)  # 12 checks of 1.5 s, 2 at once: 9 s, the first wave: not over 16 s
    reduce.checked_here(1.5)
    assert not reduce.launch.is_set()
    reduce.checked_here(1.5)
    assert reduce.launch.is_set()
    unknown.expect(None, ready=False)
    assert unknown.launch.is_set() and now.launch.is_set()
    with pytest.raises(ConfigError, match="start='later' is not one of auto, now"):
        HandOver(2, start="later")


@pytest.mark.slow
def test_ready_workers_are_not_connected_for_a_short_rest_and_are_once_work_asks():
    pytest.importorskip("distributed")
    from runner.executors.processes import ProcessExecutor

    executor = ProcessExecutor(workers=2, start="now")
    try:
        executor.handover.checked_here(0.05)  # while the workers start: a check ran here,
        executor.expect(4)  # and 4 are left
        assert executor.connection.address.wait(60), "the workers did not start"
        time.sleep(1.0)
        assert executor.starting() and executor.connection._client is None, "a short rest stays here, unconnected"
        assert not executor.connection.ready.is_set()
        assert executor.client is not None  # a check that must go to a worker connects at once
        assert not executor.starting(), "connected: every later check goes to the workers"
    finally:
        executor.close()
