"""A copy of a file checked this run takes its verdict (``statemachine.same_bytes``): the written answer of a
reduce whose check judges the file alone is not checked twice; where the check may tell them apart (it reads
the iteration's info, or judges answers on more arithmetics) it is."""

from __future__ import annotations

import json

from runner.candidates import Candidate
from statemachine import same_bytes
from statemachine.same_bytes import SameBytes
from tests.helpers.checks import reduce_args


def _candidate(key: str, twin: str | None = None) -> Candidate:
    return Candidate(key, key, None, {}, twin=twin)


def test_a_copy_holding_its_twins_bytes_is_known_and_nothing_else_is(tmp_path, monkeypatch):
    searched, answer, other = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    searched.write_bytes(b"model bytes")
    answer.write_bytes(b"model bytes")
    other.write_bytes(b"other bytes")
    seen = SameBytes(True)
    seen.note(_candidate("k"), searched)
    assert seen.copy_of(_candidate("k:answer", twin="k"), answer)
    assert not seen.copy_of(_candidate("k:answer", twin="k"), other), "other bytes"
    assert not seen.copy_of(_candidate("j:answer", twin="j"), answer), "its twin's file was never seen"
    assert not seen.copy_of(_candidate("k"), answer), "not a copy"
    off = SameBytes(False)
    off.note(_candidate("k"), searched)
    assert not off.copy_of(_candidate("k:answer", twin="k"), answer), "a checker that judges more than bytes"
    monkeypatch.setattr(same_bytes, "DIGEST_BYTES", 4)
    large = SameBytes(True)
    large.note(_candidate("k"), searched)
    assert not large.copy_of(_candidate("k:answer", twin="k"), answer), "a file past DIGEST_BYTES is not hashed"


def test_a_reduces_written_answer_takes_the_verdict_of_its_identical_candidate(run, chain, tmp_path):
    """The python check judges the file it is given: the answer as written, the same bytes as the needed
    nodes' candidate, is not checked again; with ``artifacts.iter_info`` the check could tell them apart,
    so it is."""
    r = run(*reduce_args(chain, "n2", "n5"))
    assert r.returncode == 0, r.stderr
    verified = r.summary["answer_verified"]
    assert verified["passed"] and verified["same_bytes"] and not verified["check_passed"]
    last = json.loads((r.run_dir / "replay.json").read_text())["iterations"][-1]
    assert "answer as written" in last["label"] and last["reused"]
    info = run(*reduce_args(chain, "n2", "n5"), f"artifacts.iter_info={tmp_path / 'info.json'}")
    assert info.summary["checks"] == r.summary["checks"] + 1, "the answer checked once more"
    assert "same_bytes" not in info.summary["answer_verified"]
    assert [n["name"] for n in info.summary["reduced_nodes"]] == [n["name"] for n in r.summary["reduced_nodes"]]


def test_which_checkers_judge_a_file_by_its_bytes_alone():
    """A program or a function given the file's path judge its bytes; the compare checker judges a written
    answer on more arithmetics than its search did, and a person may answer twice differently."""
    from runner.checkers.command import CommandChecker
    from runner.checkers.compare.checker import CompareChecker
    from runner.checkers.interactive import InteractiveChecker
    from runner.checkers.python import PythonChecker

    assert CommandChecker.verdict_by_bytes and PythonChecker.verdict_by_bytes
    assert not CompareChecker.verdict_by_bytes and not InteractiveChecker.verdict_by_bytes
