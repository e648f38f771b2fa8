"""Replay identity and strict entries: a resume never reuses verdicts of another model, check or inputs."""

from __future__ import annotations

import json

import onnx
import pytest

from tests.helpers.checks import reduce_args
from tests.helpers.cli import SLOW_HAS_NODES, check_cmd, one_line_error, write_script
from tests.helpers.models import chain_model


@pytest.mark.slow
def test_replay_of_another_check_model_or_shapes_is_refused(run, tmp_path, chain, has_nodes_script):
    first = run(*reduce_args(chain, "n3"), "output=a.onnx")
    assert first.returncode == 0, first.stderr[-2000:]
    replay = first.run_dir / "replay.json"
    other_check = run(*reduce_args(chain, "n5"), "output=b.onnx", f"replay.load={replay}")
    one_line_error(other_check, "replay.load=", "another check", "replay.force=true", code=2)
    edited = tmp_path / "edited.onnx"
    model = chain_model(8)
    model.graph.node[3].name = "n3"
    model.doc_string = "edited"
    onnx.save(model, edited)
    other_model = run(*reduce_args(edited, "n3"), "output=c.onnx", f"replay.load={replay}")
    one_line_error(other_model, "model content", code=2)
    other_shapes = run(
        *reduce_args(chain, "n3"), "output=d.onnx", f"replay.load={replay}", "model_input_shapes={x:[1,4]}"
    )
    one_line_error(other_shapes, "options (model_input_shapes)", code=2)
    forced = run(*reduce_args(chain, "n5"), "output=e.onnx", f"replay.load={replay}", "replay.force=true")
    # forced: every search verdict reused; the written answer is checked, then its candidate once more
    assert forced.summary["checks"] == 2
    assert forced.returncode == 3 and forced.summary["status"] == "answer not verified", (
        "the other check's verdicts led to n3, which the n5 check passes: the answer's own check says so"
    )
    assert forced.summary["answer_verified"]["passed"] is False
    assert forced.summary["reused_from_other_identity"] == forced.summary["reused"] > 0


@pytest.mark.slow
def test_replay_after_the_check_script_changed_is_refused(run, tmp_path, chain):
    script = write_script(tmp_path / "check.py", SLOW_HAS_NODES)
    first = run("mode=reduce", f"model={chain}", check_cmd(script, "{artifact}", "0", "n3"), "output=a.onnx")
    assert first.returncode == 0
    script.write_text(SLOW_HAS_NODES + "\n# fixed a bug\n")
    again = run(
        "mode=reduce",
        f"model={chain}",
        check_cmd(script, "{artifact}", "0", "n3"),
        "output=b.onnx",
        f"replay.load={first.run_dir / 'replay.json'}",
    )
    one_line_error(again, "another check", "files", code=2)


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"key": "k", "passed": "false"}, ['passed="false"', "true or false"]),
        ({"key": ["a", "b"], "passed": False}, ["key=", "a string"]),
        ({"key": "k", "passed": True, "returncode": "1"}, ["returncode="]),
        ({"passed": True}, ["lacks 'key'"]),
    ],
)
@pytest.mark.slow
def test_replay_entries_of_the_wrong_type_are_errors(run, tmp_path, chain, has_nodes_script, entry, words):
    first = run(*reduce_args(chain, "n3"), "output=a.onnx")
    data = json.loads((first.run_dir / "replay.json").read_text())
    data["iterations"].append(entry)
    bad = tmp_path / "bad_replay.json"
    bad.write_text(json.dumps(data))
    r = run(*reduce_args(chain, "n3"), "output=b.onnx", f"replay.load={bad}")
    one_line_error(r, "replay.load=", *words, code=2)


def test_replay_nested_too_deeply(run, tmp_path, chain, has_nodes_script):
    bad = tmp_path / "deep.json"
    bad.write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(run(*reduce_args(chain, "n3"), f"replay.load={bad}"), "replay.load=", code=2)


@pytest.mark.slow
def test_each_check_records_its_seconds_and_the_summary_their_sum(run, tmp_path, chain):
    """``details.check_s`` in the replay is each check's own time where it ran (here: a command that sleeps
    0.05 s), and ``summary.json``'s ``check_s`` sums those of the checks run; a resumed run reuses them at no cost."""
    script = write_script(tmp_path / "slow.py", SLOW_HAS_NODES)
    args = ["mode=reduce", f"model={chain}", check_cmd(script, "{artifact}", "0.05", "n3")]
    first = run(*args, "output=a.onnx")
    assert first.returncode == 0, first.stderr[-2000:]
    entries = json.loads((first.run_dir / "replay.json").read_text())["iterations"]
    seconds = [e["details"]["check_s"] for e in entries if not e["reused"]]  # the written answer's is its twin's
    assert all(e["details"]["verdict_s"] >= e["details"]["check_s"] for e in entries)
    assert len(seconds) == first.summary["checks"] and all(0.05 <= s < 5 for s in seconds)
    assert first.summary["check_s"] == pytest.approx(sum(seconds), abs=0.01)
    assert first.summary["check_s"] <= first.summary["wall_s"]
    again = run(*args, "output=b.onnx", f"replay.load={first.run_dir / 'replay.json'}")
    assert again.summary["checks"] == 1 and again.summary["check_s"] < first.summary["check_s"]


def test_a_verdicts_typed_facts_keep_the_replays_format():
    """crash, check_s, outputs, output_tail, sample, timeout, ... are Verdict fields, written under ``details`` as
    replay.json always held them and read back into the fields; a checker's other details stay details."""
    from runner.candidates import Verdict

    verdict = Verdict(
        False, reason="r", details={"matched": 3}, crash=True, check_s=0.5, outputs={"y": {"max_abs": 1}}, sample=2
    )
    recorded = verdict.recorded_details()
    assert recorded == {"matched": 3, "sample": 2, "crash": True, "check_s": 0.5, "outputs": {"y": {"max_abs": 1}}}
    back = Verdict.from_record(recorded, passed=False, reason="r")
    assert back == verdict and back.details == {"matched": 3} and back.sample == 2 and back.output_tail == ""
    timed = Verdict.from_record({"timeout": True, "verdict_s": 1.5}, passed=False)
    assert timed.timeout and timed.verdict_s == 1.5 and timed.details == {}
    assert Verdict(True).recorded_details() == {}


def test_unit_sets_are_written_as_runs_and_read_back():
    """A chain's candidate is a few runs of consecutive nodes: the replay holds the runs, not every index."""
    from runner.files.replay import compact_units, expand_units

    assert compact_units({9, 0, 2, 3, 4, 6, 7}) == [0, [2, 4], [6, 7], 9]
    assert compact_units(range(50_000)) == [[0, 49_999]] and compact_units([]) == []
    assert expand_units([0, [2, 4], [6, 7], 9]) == [0, 2, 3, 4, 6, 7, 9]
    assert expand_units([5, 1, 3]) == [5, 1, 3], "a plain list (older replays) is itself"
    with pytest.raises(ValueError, match="not a unit"):
        expand_units([[1, 2, 3]])
