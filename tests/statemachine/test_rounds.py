"""A round's checks on a thread pool, with work done between looks at them (look-ahead)."""

from __future__ import annotations

import time
from pathlib import Path

from runner.candidates import Candidate, Verdict
from runner.executors.local import LocalExecutor
from statemachine.rounds import Pending, RoundChecks


class SleepingChecker:
    """Passes every candidate after ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def check(self, artifact, iteration, candidate, slot=None) -> Verdict:
        time.sleep(self.seconds)
        return Verdict(True, reason=f"slept {self.seconds} s")


def _round(executor: LocalExecutor, tmp_path: Path, n: int) -> list:
    todo = [Pending(i + 1, Candidate(f"k{i}", f"candidate {i}")) for i in range(n)]
    for worker, pending in enumerate(todo):
        pending.slot = executor.slot(worker, pending.iteration)
        pending.artifact = tmp_path / f"a{worker}.onnx"
    return todo


def test_idle_work_runs_while_checks_run_and_takes_at_most_its_share(tmp_path):
    executor = LocalExecutor(workers=2)
    steps = []

    def idle() -> bool:
        steps.append(time.monotonic())
        time.sleep(0.02)
        return True

    todo = _round(executor, tmp_path, 2)
    start = time.monotonic()
    RoundChecks(executor, SleepingChecker(0.5), wait_s=0.5).run(todo, lambda: False, idle=idle)
    elapsed = time.monotonic() - start
    executor.close()
    assert all(p.verdict is not None and p.verdict.passed for p in todo)
    assert steps and steps[0] - start >= RoundChecks.START_S * 0.9  # the checks set up first
    busy = 0.02 * len(steps)  # at least: a step sleeps 0.02 s or more
    assert busy <= RoundChecks.IDLE_SHARE * elapsed + 0.02, (busy, elapsed)
    assert len(steps) >= 3  # and it does use the time it has (about 20 steps fit)


def test_idle_work_stops_when_it_has_none_left(tmp_path):
    executor = LocalExecutor(workers=2)
    left = [True, True, False]
    calls = []

    def idle() -> bool:
        calls.append(1)
        return left.pop(0)

    todo = _round(executor, tmp_path, 2)
    RoundChecks(executor, SleepingChecker(0.3), wait_s=0.5).run(todo, lambda: False, idle=idle)
    executor.close()
    assert len(calls) == 3 and all(p.verdict is not None for p in todo)
