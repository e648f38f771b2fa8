"""Fault injection: kill the runner at random points (kill -9, SIGTERM, SIGHUP), resume from the replay each
time, and get the same answer and the same checks as an uninterrupted run, with no check left running."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from tests.helpers.cli import alive, check_cmd, write_script
from tests.helpers.models import chain_model

#: fails while the model holds node n30 (its name's bytes; no other name or tensor contains them)
CHECK = """
import os, sys, time
open(sys.argv[2], "a").write(f"{os.getpid()}\\n")
time.sleep(0.03)
sys.exit(1 if sys.argv[3].encode() in open(sys.argv[1], "rb").read() else 0)
"""


def _start(cwd: Path, args, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )


def _verdicts(replay: Path):
    return [(e["key"], e["passed"]) for e in json.loads(replay.read_text())["iterations"]]


@pytest.mark.slow
def test_kill_anywhere_then_resume_gives_the_same_run(run, tmp_path):
    """The uninterrupted and the final runs run in-process (the same job, less start-up); the six killed
    ones are processes, two for each signal. Linear search from n63 down to the culprit n30 leaves more
    checks than six kills of at most two checks each can use up, so every attempt is killed mid-run."""
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(64), model)
    script = write_script(tmp_path / "check.py", CHECK)
    pids = tmp_path / "pids.txt"
    args = ["mode=reduce", "marker=linear", f"model={model}", check_cmd(script, "{artifact}", str(pids), "n30")]

    pids.write_text("")
    full = run(*args, "output=full.onnx")
    assert full.returncode == 0, full.stderr[-2000:]
    expected = _verdicts(full.run_dir / "replay.json")
    full_summary = full.summary

    rng = random.Random(20261122)
    signals = [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP]
    latest = None
    kills = 0
    for attempt in range(6):
        run_dir = tmp_path / f"attempt{attempt}"
        resume = [f"replay.load={latest}"] if latest else []
        started = len(pids.read_text().split())
        proc = _start(tmp_path, [*args, f"output=out{attempt}.onnx", *resume], run_dir)
        if rng.random() < 0.25:  # anywhere: start-up, loading, a check, writing the replay
            time.sleep(rng.uniform(0.1, 1.5))
        else:  # during or just after the k-th check of this attempt
            k = rng.randint(1, 2)
            deadline = time.monotonic() + 60
            while len(pids.read_text().split()) < started + k and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.15))
        sig = signals[attempt % len(signals)]
        if proc.poll() is None:
            proc.send_signal(sig)
            kills += 1
        code = proc.wait(timeout=60)
        assert code in (0, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGHUP), (sig, code)
        deadline = time.monotonic() + 5
        while pids.exists() and any(alive(int(p)) for p in pids.read_text().split()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(int(p)) for p in pids.read_text().split()), f"a check outlived the runner ({sig.name})"
        if (run_dir / "replay.json").exists():
            latest = run_dir / "replay.json"
            assert _verdicts(latest) == expected[: len(_verdicts(latest))], "a resumed run never changes a verdict"
    assert kills == 6

    final = run(*args, "output=final.onnx", *([f"replay.load={latest}"] if latest else []))
    assert final.returncode == 0, final.stderr[-2000:]
    done = len(_verdicts(latest)) if latest else 0
    # the written answer takes its candidate's verdict where that candidate was checked in the same run
    # (statemachine.same_bytes): always in the uninterrupted run, in the resumed one unless it was loaded
    same = [int(bool(x["answer_verified"].get("same_bytes"))) for x in (full_summary, final.summary)]
    assert final.summary["reused"] == done + same[1], "the resumed run reuses every recorded verdict"
    assert final.summary["checks"] == full_summary["checks"] - done + same[0] - same[1], "and runs only the missing"
    assert _verdicts(final.run_dir / "replay.json") == expected, "same candidates, same verdicts, same order"
    summary = final.summary
    assert summary["reduced_nodes"] == full_summary["reduced_nodes"] == [{"name": "n30", "op": "Relu"}]
    assert summary["iterations"] == full_summary["iterations"]
    assert os.path.getsize(tmp_path / "final.onnx") > 0
