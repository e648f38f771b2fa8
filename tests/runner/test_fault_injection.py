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

from tests.helpers.cli import alive, check_cmd, write_script
from tests.helpers.models import chain_model

#: fails while the model holds node n40 (its name's bytes; no other name or tensor contains them)
CHECK = """
import os, sys, time
open(sys.argv[2], "a").write(f"{os.getpid()}\\n")
time.sleep(0.1)
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


def test_kill_anywhere_then_resume_gives_the_same_run(tmp_path):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(64), model)
    script = write_script(tmp_path / "check.py", CHECK)
    pids = tmp_path / "pids.txt"
    args = ["mode=reduce", "marker=linear", f"model={model}", check_cmd(script, "{artifact}", str(pids), "n40")]

    full_dir = tmp_path / "full"
    pids.write_text("")
    full = _start(tmp_path, [*args, "output=full.onnx"], full_dir)
    assert full.wait(timeout=300) == 0
    expected = _verdicts(full_dir / "replay.json")
    full_summary = json.loads((full_dir / "summary.json").read_text())

    rng = random.Random(20261122)
    signals = [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP]
    latest = None
    kills = 0
    for attempt in range(12):
        run_dir = tmp_path / f"attempt{attempt}"
        resume = [f"replay.load={latest}"] if latest else []
        started = len(pids.read_text().split())
        proc = _start(tmp_path, [*args, f"output=out{attempt}.onnx", *resume], run_dir)
        if rng.random() < 0.25:  # anywhere: start-up, loading, a check, writing the replay
            time.sleep(rng.uniform(0.1, 1.5))
        else:  # during or just after the k-th check of this attempt
            k = rng.randint(1, 3)
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
    assert kills >= 10

    final_dir = tmp_path / "final"
    final = _start(tmp_path, [*args, "output=final.onnx", *([f"replay.load={latest}"] if latest else [])], final_dir)
    assert final.wait(timeout=300) == 0
    assert _verdicts(final_dir / "replay.json") == expected, "same candidates, same verdicts, same order"
    summary = json.loads((final_dir / "summary.json").read_text())
    assert summary["reduced_nodes"] == full_summary["reduced_nodes"] == [{"name": "n40", "op": "Relu"}]
    assert summary["iterations"] == full_summary["iterations"]
    assert os.path.getsize(tmp_path / "final.onnx") > 0
