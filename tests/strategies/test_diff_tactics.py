"""mode=diff_tactics on records written here, in Polygraphy's layout and as timing-cache records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.files.tactic_records import algorithm, replay_record, tensor_info, timing_cache_record
from tests.helpers.cli import check_cmd, one_line_error, write_script

LAYERS = ["conv1", "relu1", "conv2", "fc"]


def polygraphy_record(tactics: dict) -> dict:
    """Polygraphy's TacticReplayData JSON, as `polygraphy run --save-tactics` writes it (written out by hand)."""
    io = {
        "polygraphy_class": "TensorInfo",
        "dtype": "DataType.HALF",
        "strides": [64, 1, 1, 1],
        "vectorized_dim": -1,
        "components_per_element": 1,
    }
    return {
        "replay": {
            layer: {
                "polygraphy_class": "Algorithm",
                "implementation": impl,
                "tactic": tactic,
                "inputs": [io],
                "outputs": [io],
            }
            for layer, (impl, tactic) in tactics.items()
        },
        "polygraphy_class": "TacticReplayData",
    }


def recorder_record(tactics: dict) -> dict:
    """The same layout as mode=build's TensorRT 10 recorder writes it (runner.trt.tactics uses these helpers)."""
    io = tensor_info("DataType.HALF", [64, 1, 1, 1], -1, 1)
    return replay_record({layer: algorithm(impl, tactic, [io], [io]) for layer, (impl, tactic) in tactics.items()})


def timing_record(tactics: dict) -> dict:
    """A TensorRT 11 timing-cache record as mode=build writes it."""
    return timing_cache_record({k: (t, 0.1) for k, t in tactics.items()}, "11.4.0")


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def _good(i):
    return {layer: (1000 + j, 10 + (i + j) % 2) for j, layer in enumerate(LAYERS)}


def test_polygraphy_records_planted_bad_tactic(run, tmp_path):
    d = tmp_path / "records"
    for i in range(3):
        _write(d / "good" / f"g{i}.json", polygraphy_record(_good(i)))
    for i in range(2):
        bad = _good(i)
        bad["conv2"] = (0xBAD, 99)
        _write(d / "bad" / f"b{i}.json", polygraphy_record(bad))
    r = run("mode=diff_tactics", f"dir={d}")
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert s["good_records"] == 3 and s["bad_records"] == 2
    assert list(s["potentially_bad"]) == ["conv2"]
    [entry] = s["potentially_bad"]["conv2"]
    assert (
        entry["bad_records"] == 2 and "Tactic: 99" in entry["tactic"] and f"Implementation: {0xBAD}" in entry["tactic"]
    )
    assert "Potentially bad: layer conv2" in r.stdout


def test_timing_cache_records_and_good_bad_lists(run, tmp_path):
    keys = ["key-a", "key-b", "key-c"]
    goods = [
        _write(tmp_path / f"g{i}.json", timing_record({k: 0x10 + j for j, k in enumerate(keys)})) for i in range(2)
    ]
    bads = [
        _write(tmp_path / f"b{i}.json", timing_record({"key-a": 0x10, "key-b": 0x666 + i, "key-c": 0x12}))
        for i in range(2)
    ]
    r = run("mode=diff_tactics", f"good=[{goods[0]},{goods[1]}]", f"bad=[{bads[0]},{bads[1]}]")
    assert r.returncode == 0, r.stderr
    report = r.summary["potentially_bad"]
    assert list(report) == ["key-b"]
    assert sorted(e["tactic"] for e in report["key-b"]) == ["tactic 0x666", "tactic 0x667"]


def test_recorder_layout_equals_polygraphy_layout(run, tmp_path):
    """Records written by mode=build (TensorRT 10) and by Polygraphy compare as the same tactics."""
    tactics = _good(0)
    assert recorder_record(tactics) == polygraphy_record(tactics)
    good = _write(tmp_path / "polygraphy.json", polygraphy_record(tactics))
    bad_tactics = dict(tactics, fc=(7, 7))
    bad = _write(tmp_path / "ours.json", recorder_record(bad_tactics))
    r = run("mode=diff_tactics", f"good=[{good}]", f"bad=[{bad}]")
    assert r.returncode == 0, r.stderr
    assert list(r.summary["potentially_bad"]) == ["fc"]


def test_no_difference_says_so(run, tmp_path):
    for side in ("good", "bad"):
        _write(tmp_path / "d" / side / "r.json", polygraphy_record(_good(0)))
    r = run("mode=diff_tactics", f"dir={tmp_path / 'd'}")
    assert r.returncode == 0 and r.summary["potentially_bad"] == {}
    assert "Could not determine potentially bad tactics" in r.stdout


def test_only_good_builds_end_ok_saying_no_tactic_can_be_blamed(run, tmp_path):
    """Issue 52: as Polygraphy, a run with no bad record logs that no tactic can be blamed and succeeds (it
    printed ``error:`` and exited 2); an explicit bad source that does not exist is still an error."""
    _write(tmp_path / "d" / "good" / "r.json", polygraphy_record(_good(0)))
    (tmp_path / "d" / "bad").mkdir()
    r = run("mode=diff_tactics", f"dir={tmp_path / 'd'}")
    assert r.returncode == 0 and r.summary["potentially_bad"] == {} and r.summary["bad_records"] == 0, r.stderr
    assert "Could not determine potentially bad tactics: no bad tactic records" in r.stdout
    assert "error:" not in r.stderr


def test_every_build_good_says_the_culprit_cannot_be_determined(run, tmp_path):
    """Issue 38: mode=build makes bad/ only once a build is bad; with every build good the run said "bad record
    source ... does not exist" instead of why no tactic can be blamed."""
    _write(tmp_path / "d" / "good" / "r.json", polygraphy_record(_good(0)))
    r = run("mode=diff_tactics", f"dir={tmp_path / 'd'}")
    assert r.returncode == 0, r.stderr
    assert "every build so far was good" in r.stdout and "does not exist" not in r.stdout
    missing = run("mode=diff_tactics", f"good=[{tmp_path / 'd' / 'good'}]", f"bad=[{tmp_path / 'nowhere'}]")
    one_line_error(missing, "bad record source", "does not exist", code=2)


def test_only_bad_builds_blame_every_tactic_of_them(run, tmp_path):
    _write(tmp_path / "d" / "bad" / "r.json", polygraphy_record(_good(0)))
    r = run("mode=diff_tactics", f"dir={tmp_path / 'd'}")
    assert r.returncode == 0 and r.summary["potentially_bad"], r.stderr


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{not json", "not JSON"),
        ('{"replay": {}}', "neither"),
        ('{"polygraphy_class": "TacticReplayData", "replay": {"l": {"tactic": 1}}}', "needs 'implementation'"),
    ],
)
def test_malformed_file_named_explicitly_is_an_error(run, tmp_path, content, problem):
    good = _write(tmp_path / "good.json", polygraphy_record(_good(0)))
    bad = _write(tmp_path / "broken.json", content)
    r = run("mode=diff_tactics", f"good=[{good}]", f"bad=[{bad}]")
    assert r.returncode == 2
    line = next(text for text in r.stderr.splitlines() if text.startswith("error:"))
    assert "broken.json" in line and problem in line


def test_malformed_file_in_a_directory_is_skipped_with_a_warning(run, tmp_path):
    d = tmp_path / "d"
    _write(d / "good" / "r.json", polygraphy_record(_good(0)))
    _write(d / "good" / "notes.txt", "hello")
    bad = _good(0)
    bad["fc"] = (1, 1)
    _write(d / "bad" / "r.json", polygraphy_record(bad))
    r = run("mode=diff_tactics", f"dir={d}")
    assert r.returncode == 0
    assert "notes.txt" in r.stdout and list(r.summary["potentially_bad"]) == ["fc"]


def test_mismatched_layers_are_reported(run, tmp_path):
    d = tmp_path / "d"
    _write(d / "good" / "r.json", polygraphy_record(_good(0)))
    other = {"other_layer": (1, 2)}
    _write(d / "bad" / "r.json", polygraphy_record(other))
    r = run("mode=diff_tactics", f"dir={d}")
    assert r.returncode == 0
    assert "Layers differ across records" in r.stdout and "other_layer" in r.summary["mismatched_layers"]


@pytest.mark.slow  # five check processes: 1.2 s here, past 1.5 s on a busy machine
def test_records_sorted_by_a_repeat_run_then_diffed(run, tmp_path):
    """The build workflow without TensorRT: a check writes a record per run, sorting files it, diff reads it."""
    script = write_script(
        tmp_path / "fake_build.py",
        f"""
import json, os, sys
n = int(os.environ["RUNNER_ITERATION"])
tactic = 666 if n in (2, 4) else 7
rec = {json.dumps(polygraphy_record({"conv": (1, 7)}))}
rec["replay"]["conv"]["tactic"] = tactic
json.dump(rec, open("tactics.json", "w"))
sys.exit(1 if tactic == 666 else 0)
""",
    )
    art = tmp_path / "art"
    r = run("mode=repeat", "until=5", check_cmd(script), "artifacts.paths=[tactics.json]", f"artifacts.dir={art}")
    assert r.returncode == 0, r.stderr
    diff = run("mode=diff_tactics", f"dir={art}")
    assert diff.returncode == 0, diff.stderr
    [entry] = diff.summary["potentially_bad"]["conv"]
    assert entry["bad_records"] == 2 and "Tactic: 666" in entry["tactic"]


def test_diff_tactics_needs_sources(run):
    r = run("mode=diff_tactics")
    assert r.returncode == 2 and "dir=DIR" in r.stderr


def test_build_without_tensorrt_names_the_extra(run, tmp_path):
    from runner.trt import tensorrt_available

    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    r = run("mode=build", "until=3", "model=whatever.onnx", 'checker.cmd="true"')
    assert r.returncode == 2
    assert "install the 'trt' extra" in r.stderr and "mode=build" in r.stderr and "Traceback" not in r.stderr
