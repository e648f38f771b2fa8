"""Precision when most of the model must stay: the early verdict and the measured trade-off
(``strategies.precision.tradeoff``), budgets that stop with the best answer checked so far and resume to the minimal one
(``strategies.budget``)."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from examples.planted import f32, make_model
from runner.candidates import Verdict
from strategies.precision.tradeoff import Tradeoff
from tests.helpers.cli import one_line_error

TIGHT = ["checker=compare", "checker.backend=fp16_emulation", "checker.check_error_stat=rel_l2", "checker.rtol=3e-4"]


@pytest.fixture
def dense(tmp_path):
    """A chain of 32 Muls by vectors near 1: each one's fp16 rounding adds about 1e-4 of rel L2 error, so at
    3e-4 most must stay in fp32 (29 of 32)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(32):
        inits.append(numpy_helper.from_array((1 + 0.3 * rng.standard_normal(16)).astype(np.float32), f"s{i}"))
        out = "y" if i == 31 else f"t{i}"
        nodes.append(helper.make_node("Mul", [x, f"s{i}"], [out], name=f"mul{i}"))
        x = out
    path, inputs = tmp_path / "dense.onnx", tmp_path / "x.npz"
    onnx.save(make_model(nodes, [f32("x", [1, 16])], [f32("y", [1, 16])], inits), path)
    np.savez(inputs, x=np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32))
    return ["mode=precision", "marker=minimal", f"model={path}", f"inputs={inputs}", *TIGHT]


@pytest.mark.slow  # about 45 checks
def test_most_must_stay_is_said_within_20_checks_with_the_measured_tradeoff(run, dense):
    r = run(*dense)
    assert r.returncode == 0, r.stderr[-2000:]
    verdict = r.summary["most_must_stay"]
    assert verdict["checks"] <= 20 and verdict["kept"] * 2 > verdict["total"] == 32
    assert verdict["worst_output"] == "y" and any("bfloat16" in t for t in verdict["try"])
    assert "Most of the model may have to stay" in (r.run_dir / "runner.log").read_text()
    points = r.summary["tradeoff"]
    assert len(points) >= r.summary["checks"] - 5 and all(
        set(p) <= {"low_nodes", "kept", "statistic", "passed", "nonfinite"} for p in points
    )
    assert all(p["low_nodes"] + p["kept"] == 32 for p in points)
    assert any(p["passed"] for p in points) and any(not p["passed"] for p in points)
    assert (r.run_dir / "tradeoff.png").stat().st_size > 1000
    assert r.summary["kept"] >= 24 and "minimal" not in r.summary
    first = r.summary["first_pass"]
    assert first["total"] == 32 and r.summary["kept"] <= first["kept"] and first["checks"] <= 20
    passed_first = next(p for p in points if p["passed"])
    assert passed_first["kept"] == first["kept"] and points.index(passed_first) + 1 == first["checks"]
    assert f"At most {first['kept']} of 32 nodes must stay in float32" in (r.run_dir / "runner.log").read_text()


def test_the_verdict_is_withdrawn_when_a_candidate_keeping_at_most_half_passes(caplog):
    # the 0.5B decoder's sequence on an H200: its ranking put a needed node late
    tradeoff = Tradeoff(1729, "float16")
    out = {"logits": {"statistic": 0.12}}
    with caplog.at_level(logging.INFO, logger="strategies.precision.tradeoff"):
        for kept, passed in ((24, False), (653, False), (1168, True), (889, False), (865, True), (841, True)):
            tradeoff.add(kept, Verdict(passed=passed, outputs=out))
    facts = tradeoff.facts()["most_must_stay"]
    assert facts["kept"] == 889 and facts["checks"] == 4
    assert facts["withdrawn"] == {"kept": 841, "checks": 6}, "865 is still more than half"
    assert "need not stay after all: a candidate keeping 841 of 1729" in caplog.text
    tradeoff.add(100, Verdict(passed=True, outputs=out))
    assert tradeoff.facts()["most_must_stay"]["withdrawn"]["kept"] == 841, "withdrawn once"


def test_a_verdict_never_said_is_never_withdrawn():
    tradeoff = Tradeoff(10, "bfloat16")
    for kept, passed in ((2, False), (4, True), (3, True)):
        tradeoff.add(kept, Verdict(passed=passed))
    assert "most_must_stay" not in tradeoff.facts() and tradeoff.first_pass["kept"] == 4


@pytest.mark.slow  # a budgeted run and its resume
def test_a_budgeted_run_stops_verified_and_its_resume_ends_minimal_without_checking_a_verdict_twice(
    run, dense, tmp_path
):
    budgeted = run(*dense, "budget.checks=12", f"output={tmp_path / 'short.onnx'}")
    assert budgeted.returncode == 0, budgeted.stderr[-2000:]
    s = budgeted.summary
    assert s["minimal"] is False and "budget.checks=12 reached" in s["minimal_why"]
    assert s["answer_verified"]["check_passed"] is True and s["checks"] <= 13
    assert s["budget"]["spent_checks"] == s["checks"]
    full = run(*dense, f"output={tmp_path / 'full.onnx'}")
    resumed = run(*dense, f"replay.load={budgeted.run_dir / 'replay.json'}", f"output={tmp_path / 'resumed.onnx'}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "minimal" not in resumed.summary and resumed.summary["kept_nodes"] == full.summary["kept_nodes"]
    assert resumed.summary["kept"] <= s["kept"] and resumed.summary["reused"] >= s["checks"] - 1
    replayed = json.loads((budgeted.run_dir / "replay.json").read_text())["iterations"]
    checked_again = [it for it in json.loads((resumed.run_dir / "replay.json").read_text())["iterations"]
                     if not it.get("reused") and it["key"] in {r["key"] for r in replayed}]  # fmt: skip
    assert not [it for it in checked_again if ":answer" not in it["key"]], "no search verdict checked twice"


@pytest.mark.parametrize("key, words", [("budget.checks=0", "1 or more"), ("budget.seconds=-1", "above 0")])
def test_a_budget_that_allows_nothing_is_one_line(run, dense, key, words):
    one_line_error(run(*dense, key), key.split("=")[0] + "=", words, code=2)


@pytest.mark.slow  # four runs
def test_a_resume_and_a_run_at_another_tolerance_rank_nothing_again(run, dense):
    """The rankings go to ranking.json in the run directory, keyed by what they depend on; a resume reads the file
    beside its replay, another run the one it names (rankings=), whatever its tolerance or marker."""
    first = run(*dense, "budget.checks=6")
    stored = json.loads((first.run_dir / "ranking.json").read_text())
    assert stored["format"] == "onnx-debug-runner rankings" and stored["rankings"][0]["kind"] == "introduced"
    assert len(stored["rankings"][0]["order"]) == 32
    resumed = run(*dense, f"replay.load={first.run_dir / 'replay.json'}")
    log = (resumed.run_dir / "runner.log").read_text()
    assert "introduced ranking is read from an earlier run's ranking.json" in log
    assert "Nodes ranked by the error each introduces" not in log
    looser = [a for a in dense if not a.startswith("checker.rtol")] + [
        "checker.rtol=1e-3",
        "marker=bisect",
        "direction=ranked",
    ]
    other = run(*[a for a in looser if a != "marker=minimal"], f"rankings={first.run_dir}")
    assert (
        other.returncode == 0
        and "read from an earlier run's ranking.json" in (other.run_dir / "runner.log").read_text()
    )
    fp16 = run(*[a.replace("fp16_emulation", "bf16_emulation") for a in dense], "low_precision=bfloat16",
               f"rankings={first.run_dir}")  # fmt: skip
    assert "read from an earlier run" not in (fp16.run_dir / "runner.log").read_text(), "another precision: its own"


def test_the_budget_keeps_room_for_the_answer_and_refuses_work_it_cannot_afford():
    """``budget.seconds`` stops the search two checks' time early (the answer's own check comes within it) and
    gives a second ranking half of what is left (``Budget.allowance``; the ranking paces itself against it)."""
    import time

    from strategies.budget import Budget

    budget = Budget(seconds=100.0, started=time.monotonic() - 40.0)
    assert Budget(checks=10).allowance() is None, "no time limit"
    for _ in range(8):
        budget.took(frozenset({1, 2}), hit=True, reused=False)
    budget.took(frozenset({1}), hit=False, reused=True)
    assert budget.spent == 8 and budget.best == frozenset({1, 2})
    assert budget.allowance() == pytest.approx(30.0, abs=0.5), "60 s left: half of it"
    assert Budget(seconds=10.0, started=time.monotonic() - 40.0).allowance() == 0.0, "past its limit: nothing"
    assert budget.over() == ""
    late = Budget(seconds=100.0, started=time.monotonic() - 91.0, spent=10)
    assert "budget.seconds=100 reached" in late.over(), "91 s and two 9 s checks to come is past 100"
    assert Budget(checks=3, spent=3).over() == "budget.checks=3 reached"
    heavy = Budget(seconds=100.0, started=time.monotonic() - 70.0, spent=10, answer_bytes=int(2e9))
    assert "budget.seconds=100 reached" in heavy.over(), "70 s, two 7 s checks and 2 GB to write and read back"
    assert Budget(seconds=100.0, started=time.monotonic() - 70.0, spent=10).over() == ""


def test_the_budget_and_wall_seconds_count_from_the_launch(dense, tmp_path):
    """``python -m runner`` gives the run its launch (``runner.__main__``): the imports and Hydra's composition
    count against ``budget.seconds`` and in ``wall_s``. A run launched 1,000 s ago with 500 s to spend stops at
    its first chance, with a verified answer."""
    import time

    from tests.helpers.inprocess import run_in_process

    r = run_in_process(tmp_path, "late", *dense, "budget.seconds=500", started=time.monotonic() - 1000)
    assert r.returncode == 0, r.stderr[-2000:]
    s = r.summary
    assert s["wall_s"] >= 1000 and s["budget"]["spent_seconds"] >= 1000
    assert s["minimal"] is False and "budget.seconds=500 reached" in s["minimal_why"]
    assert s["answer_verified"]["check_passed"] is True


def test_the_tradeoff_picture_names_its_axes_tolerance_answer_and_a_programs_verdicts(tmp_path):
    """Issue 78: ``tradeoff.png`` as a person reads it: a title naming the model, the precision and the statistic,
    the tolerance as a line, the first passing candidate and the answer marked, NaN/Inf failures apart (their
    statistic says nothing); a program's check (no statistic) gets its verdicts over the nodes kept."""
    import matplotlib.pyplot as plt

    from runner.candidates import Verdict
    from strategies.precision.tradeoff import Tradeoff

    def compared(kept_stat: float, passed: bool, nonfinite: int = 0) -> Verdict:
        stats = {"statistic": kept_stat, "limit": 0.05, "measure": "relative L2 error", "new_nonfinite": nonfinite}
        return Verdict(passed=passed, outputs={"logits": stats})

    measured = Tradeoff(40, "float16")
    for kept, stat, passed, bad in ((1, 0.0, False, 5), (2, 0.3, False, 0), (8, 0.04, True, 0), (6, 0.02, True, 0)):
        measured.add(kept, compared(stat, passed, bad))
    assert measured.points[0]["nonfinite"] and measured.limit == 0.05
    fig = measured.figure(answer=6, model="decoder.onnx")
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "decoder.onnx: float16 precision search" in ax.get_title() and "relative L2 error" in ax.get_title()
    assert "tolerance (0.05)" in labels and "the answer (6 kept)" in labels and "fails with NaN/Inf (1)" in labels
    assert any(label.startswith("first to pass (8 kept, check 3)") for label in labels)
    assert "nodes kept in float32 (of 40 searched" in ax.get_xlabel() and ax.get_yscale() == "log"
    plt.close(fig)
    program = Tradeoff(40, "int8")
    for kept, passed in ((1, False), (4, True), (2, True)):
        program.add(kept, Verdict(passed=passed))
    path = program.plot(tmp_path / "tradeoff.png", answer=2, model="detector.onnx")
    assert path is not None and path.stat().st_size > 1000
    fig = program.figure(answer=2)
    assert "verdicts of the check program" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["fails", "passes"]
    plt.close(fig)
