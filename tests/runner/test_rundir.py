"""Run isolation: concurrent runs never share a run directory, and a directory in use is refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import onnx

from tests.helpers.cli import SLOW_HAS_NODES, check_cmd, start_process, write_script


def test_two_runs_started_together_give_their_own_answers(tmp_path, chain):
    """Default run directories and default output names: each run gets its own, and its own answer."""
    script = write_script(tmp_path / "slow.py", SLOW_HAS_NODES)
    runs = {
        c: start_process(tmp_path, "mode=reduce", f"model={chain}", check_cmd(script, "{artifact}", "0.05", c))
        for c in ("n2", "n5")
    }
    outputs = {}
    for culprit, proc in runs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        replay_line = next(line for line in out.splitlines() if line.startswith("replay"))
        summary = json.loads((Path(replay_line.split()[-1]).parent / "summary.json").read_text())
        assert [n["name"] for n in summary["reduced_nodes"]] == [culprit]
        outputs[culprit] = summary["output"]
        names = [n.name for n in onnx.load(summary["output"]).graph.node if n.op_type != "Constant"]
        assert names == [culprit]
    assert len(set(outputs.values())) == 2
    assert {Path(p).name for p in outputs.values()} == {"reduced.onnx", "reduced_1.onnx"}


def test_a_run_directory_in_use_is_refused(tmp_path, chain):
    script = write_script(tmp_path / "slow.py", SLOW_HAS_NODES)
    run_dir = tmp_path / "shared_run"
    first = start_process(
        tmp_path,
        "mode=reduce",
        f"model={chain}",
        check_cmd(script, "{artifact}", "0.3", "n3"),
        "output=a.onnx",
        run_dir=run_dir,
    )
    deadline = time.monotonic() + 60
    while not (run_dir / "checks").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = start_process(
        tmp_path,
        "mode=reduce",
        f"model={chain}",
        check_cmd(script, "{artifact}", "0", "n5"),
        "output=b.onnx",
        run_dir=run_dir,
    )
    _out2, err2 = second.communicate(timeout=60)
    assert second.returncode == 2 and "in use by another running run" in err2, err2
    _out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [n["name"] for n in summary["reduced_nodes"]] == ["n3"]
    assert not (tmp_path / "b.onnx").exists()
