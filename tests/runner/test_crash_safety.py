"""A check that crashes the runner (os.abort(), SIGSEGV in an in-process check): the replay holds the candidate as
pending, a resumed run counts it as a crash and goes on; checker.isolate=true turns the crash into a verdict at once."""

from __future__ import annotations

import json
import signal

import onnx
import pytest

from tests.helpers.models import ROOT, chain_model

CRASHING = "n0,n1"  # a candidate bisect checks on the chain, which passes when it does not crash
CHECK = ["mode=reduce", "checker=python", "checker.target=tests.helpers.crashing.check"]


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the check module, for runs in a subprocess
    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), path)
    return path


def _answer(r):
    return [n["name"] for n in r.summary["reduced_nodes"]]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["abort", "segv"])
def test_a_resumed_run_counts_the_pending_candidate_as_a_crash(run_cli, model, monkeypatch, tmp_path, how):
    monkeypatch.setenv("CRASH_NODES", CRASHING)
    monkeypatch.setenv("CRASH_HOW", how)
    crashed = run_cli(*CHECK, f"model={model}")
    assert crashed.returncode in (-signal.SIGABRT, -signal.SIGSEGV, 128 + signal.SIGABRT, 128 + signal.SIGSEGV)
    replay = crashed.run_dir / "replay.json"
    pending = json.loads(replay.read_text())["pending"]
    assert len(pending) == 1 and "searching" in pending[0]["label"]

    resumed = run_cli(*CHECK, f"model={model}", f"replay.load={replay}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.summary["crashes"] == 1 and resumed.summary["status"] == "ok"
    assert "crashed the runner" in resumed.stderr + (resumed.run_dir / "runner.log").read_text()

    monkeypatch.setenv("CRASH_HOW", "fail")
    failing = run_cli(*CHECK, f"model={model}")
    assert failing.returncode == 0 and _answer(resumed) == _answer(failing)
    assert json.loads((resumed.run_dir / "replay.json").read_text())["pending"] == []


@pytest.mark.slow
def test_isolated_checks_turn_a_segfault_into_a_crash_verdict(run_cli, model, monkeypatch):
    monkeypatch.setenv("CRASH_NODES", CRASHING)
    monkeypatch.setenv("CRASH_HOW", "segv")
    r = run_cli(*CHECK, f"model={model}", "checker.isolate=true")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.summary["status"] == "ok" and r.summary["crashes"] == 1
    assert "signal SIGSEGV" in r.stderr + (r.run_dir / "runner.log").read_text()
    monkeypatch.setenv("CRASH_HOW", "fail")
    assert _answer(r) == _answer(run_cli(*CHECK, f"model={model}"))


def test_a_clean_stop_leaves_nothing_pending(run, model, tmp_path):
    """A check error (not a crash) stops the run: its candidate is not left pending for a resume to blame."""
    r = run(*CHECK[:2], "checker.target=tests.helpers.crashing.no_such_function", f"model={model}")
    assert r.returncode == 2
    replay = r.run_dir / "replay.json"
    if replay.exists():
        assert json.loads(replay.read_text()).get("pending", []) == []


@pytest.mark.slow
def test_isolated_compare_checks_give_the_same_verdicts(run, model, tmp_path):
    import numpy as np

    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones((1, 4), np.float32))
    args = ["mode=repeat", "until=2", f"model={model}", f"inputs={inputs}", "checker=compare"]
    plain = run(*args)
    isolated = run(*args, "checker.isolate=true")
    assert plain.returncode == isolated.returncode == 0, isolated.stderr[-2000:]
    assert isolated.summary["crashes"] == 0 and plain.summary["good"] == isolated.summary["good"] == 2


def test_isolation_inside_worker_processes_is_refused(run, model):
    from tests.helpers.cli import one_line_error

    r = run(*CHECK, f"model={model}", "checker.isolate=true", "executor=processes")
    one_line_error(r, "checker.isolate=true with executor=processes", code=2)
