"""Run isolation: concurrent runs never share a run directory, and a directory in use is refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import onnx
import pytest

from tests.helpers.cli import SLOW_HAS_NODES, check_cmd, start_process, write_script


@pytest.mark.slow
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


#: a check that waits until the file named first exists (the test opens the gate), then fails while the
#: model holds every node named after the artifact
GATED_HAS_NODES = """
import os, sys, time, onnx
gate = sys.argv[1]
while not os.path.exists(gate):
    time.sleep(0.01)
names = {n.name for n in onnx.load(sys.argv[2], load_external_data=False).graph.node}
sys.exit(1 if all(x in names for x in sys.argv[3:]) else 0)
"""


@pytest.mark.slow
def test_a_run_directory_in_use_is_refused(tmp_path, chain):
    """The first run is held inside its first check (its check waits on a gate file the test opens), so the
    second meets a directory in use, whatever the machine's speed."""
    script = write_script(tmp_path / "gated.py", GATED_HAS_NODES)
    gate = tmp_path / "gate"
    run_dir = tmp_path / "shared_run"

    def start(culprit: str, output: str):
        check = check_cmd(script, str(gate), "{artifact}", culprit)
        return start_process(tmp_path, "mode=reduce", f"model={chain}", check, f"output={output}", run_dir=run_dir)

    first = start("n3", "a.onnx")
    deadline = time.monotonic() + 120
    while not (run_dir / "checks").exists() and time.monotonic() < deadline:  # its first check started
        time.sleep(0.05)
    try:
        second = start("n5", "b.onnx")
        _out2, err2 = second.communicate(timeout=60)
    finally:
        gate.touch()  # the first run goes on
    assert second.returncode == 2 and "in use by another running run" in err2, err2
    _out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [n["name"] for n in summary["reduced_nodes"]] == ["n3"]
    assert not (tmp_path / "b.onnx").exists()


def test_a_finished_run_is_offered_for_resuming_only_when_it_has_a_replay(tmp_path):
    """A run that ended before its first check (a bad option) wrote a summary and no replay: nothing to resume."""
    from runner.errors import ArtifactError
    from runner.files.rundir import refuse_finished

    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ArtifactError) as e:
        refuse_finished(tmp_path, reuse=False)
    assert "holds a finished run (summary.json)" in str(e.value) and "replay.load" not in str(e.value)
    (tmp_path / "replay.json").write_text("{}")
    with pytest.raises(ArtifactError, match=r"resume it with replay.load=.*replay\.json\)"):
        refuse_finished(tmp_path, reuse=False)
    refuse_finished(tmp_path, reuse=True)  # replaced on request
