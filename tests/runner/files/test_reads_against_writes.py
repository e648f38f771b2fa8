"""Every write against every read (issue 74), generated: for each mode, every key that names a file the run writes
(``runner.run.plan.OUTPUT_OPTIONS`` and the keys that write beside or move: ``external_data_path``,
``calibration.cache``, ``artifacts.paths``) is pointed at each file the run reads, in each role a run reads one (the
model and its external data, ``quantized_model=`` and its data, inputs, golden values, a replay, rankings, a reference
model, a loader's script, a python check's module and arguments, a check command's script, a calibration cache),
with ``overwrite=true``. Each run is refused in one line (exit 2, no traceback) or takes another name, and every file
of the user's keeps its sha256. A role or key added later joins by being listed in the tables below."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner.config_keys import mode_keys, mode_uses
from runner.run.plan import OUTPUT_OPTIONS

#: keys that write a file beside another or move one, besides the output options
OTHER_WRITES = ("external_data_path", "calibration.cache", "artifacts.paths")


def _matmuls(path: Path, data: str) -> Path:
    """Three MatMuls by 8x8 weights, saved with external data ``data`` beside ``path``."""
    weights = [numpy_helper.from_array(np.eye(8, dtype=np.float32) * (i + 1), f"w{i}") for i in range(3)]
    nodes = [
        helper.make_node("MatMul", ["x" if i == 0 else f"t{i - 1}", f"w{i}"], [f"t{i}"], name=f"mm{i}")
        for i in range(3)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("t2", TensorProto.FLOAT, [1, 8])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, location=data, size_threshold=0)
    return path


def _user_files(folder: Path) -> Dict[str, Path]:
    """The user's files, one per role a run reads a file in."""
    folder.mkdir()
    files = {
        "model": _matmuls(folder / "m.onnx", "m.bin"),
        "quantized_model": _matmuls(folder / "q.onnx", "q.bin"),
        "reference_model": _matmuls(folder / "ref.onnx", "ref.bin"),
    }
    files["model data"], files["quantized data"] = folder / "m.bin", folder / "q.bin"
    np.savez(folder / "x.npz", x=np.ones((1, 8), np.float32))
    np.savez(folder / "g.npz", t2=np.ones((1, 8), np.float32) * 6)
    files["inputs"], files["golden"] = folder / "x.npz", folder / "g.npz"
    for name in ("replay.json", "rk.json", "cal.json"):
        (folder / name).write_text(json.dumps({"format": "the user's own", "name": name}) + "\n")
    files["replay.load"], files["rankings"], files["calibration.cache"] = (
        folder / "replay.json",
        folder / "rk.json",
        folder / "cal.json",
    )
    (folder / "loader.py").write_text(
        "import numpy as np\n\ndef load():\n    for _ in range(2):\n        yield {'x': np.ones((1, 8), np.float32)}\n"
    )
    (folder / "userchk.py").write_text(
        "import onnx\n\ndef lacks(path, *names):\n"
        "    return not set(names) & {n.name for n in onnx.load(path, load_external_data=False).graph.node}\n"
    )
    (folder / "c.py").write_text(
        "import sys, onnx\nsys.exit(1 if 'mm1' in {n.name for n in onnx.load(sys.argv[1], load_external_data=False)"
        ".graph.node} else 0)\n"
    )
    (folder / "arg.txt").write_text("mm1\n")
    files["data_loader"], files["checker.target"] = folder / "loader.py", folder / "userchk.py"
    files["checker.cmd"], files["checker.args"] = folder / "c.py", folder / "arg.txt"
    for side in ("good", "bad"):
        (folder / f"{side}.json").write_text(json.dumps({"format": "the user's tactics", "side": side}) + "\n")
        files[side] = folder / f"{side}.json"
    return files


def _sums(folder: Path) -> Dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


#: the overrides that make a run read a role's file: ``role -> (top-level key the mode must take, overrides)``
def _role_overrides(files: Dict[str, Path]) -> Dict[str, Tuple[str, List[str]]]:
    python = ["checker=python", "checker.target=userchk.lacks", f"checker.args=[mm1,{files['checker.args']}]"]
    return {
        "model": ("model", []),
        "model data": ("model", []),
        "quantized_model": ("quantized_model", [f"quantized_model={files['quantized_model']}"]),
        "quantized data": ("quantized_model", [f"quantized_model={files['quantized_model']}"]),
        "reference_model": ("reference_model", [f"reference_model={files['reference_model']}"]),
        "inputs": ("inputs", [f"inputs={files['inputs']}"]),
        "golden": ("golden", ["checker=compare", f"golden={files['golden']}", f"inputs={files['inputs']}"]),
        "replay.load": ("replay", [f"replay.load={files['replay.load']}"]),
        "rankings": ("rankings", [f"rankings={files['rankings']}"]),
        "calibration.cache": ("calibration", [f"calibration.cache={files['calibration.cache']}"]),
        "data_loader": ("data_loader", [f"data_loader={files['data_loader']}:load"]),
        "checker.target": ("model", python),
        "checker.args": ("model", python),
        "checker.cmd": ("model", [f'checker.cmd="python {files["checker.cmd"]} {{artifact}}"']),
        "good": ("good", [f"good=[{files['good']}]", f"bad=[{files['bad']}]"]),
        "bad": ("bad", [f"good=[{files['good']}]", f"bad=[{files['bad']}]"]),
    }


#: each mode's run before any role is added
BASE: Dict[str, List[str]] = {
    "reduce": ["mode=reduce"],
    "precision": ["mode=precision", "checker=compare"],
    "layerwise": ["mode=layerwise"],
    "repeat": ["mode=repeat", "until=1"],
    "build": ["mode=build", "until=1"],
    "diff_tactics": ["mode=diff_tactics"],
}
#: the check of a mode that takes one, where the role sets none: fails while the model holds mm1
CHECK: Dict[str, List[str]] = {
    "reduce": ["checker=python", "checker.target=userchk.lacks", "checker.args=[mm1]"],
    "repeat": ["checker.cmd=true"],
}
#: the roles that are the check itself
CHECK_ROLES = ("checker.target", "checker.args", "checker.cmd")
#: what a write key needs set to be taken at all: ``{key: {mode: overrides}}``
INT8 = {"precision": ["low_precision=int8"], "layerwise": ["checker.low_precision=int8"]}
WRITE_NEEDS: Dict[str, Dict[str, List[str]]] = {"calibration.cache": INT8}
#: roles that go with none of a write key's needs (a given quantized model brings its own precision)
WRITE_EXCLUDES = {"calibration.cache": ("quantized_model", "quantized data")}


def _write_overrides(key: str, target: Path, out_dir: Path) -> List[str]:
    """The overrides that point the write ``key`` at ``target``."""
    if key == "external_data_path":
        return [f"output={target.parent / 'answer.onnx'}", f"external_data_path={target.name}"]
    if key == "artifacts.paths":
        return [f"artifacts.paths=[{target}]"]
    return [f"{key}={target}"]


def _uses(mode: str, key: str) -> bool:
    top = key.split(".")[0]
    return top in ("checker", "artifacts", "replay") or mode_uses(mode, top)


def test_the_tables_cover_every_mode():
    assert set(BASE) == set(mode_keys())


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(BASE))
def test_no_write_of_a_mode_replaces_a_file_it_reads(run, tmp_path, monkeypatch, mode):
    folder = tmp_path / "user"
    files = _user_files(folder)
    monkeypatch.syspath_prepend(str(folder))
    before = _sums(folder)
    writes = [k for k in (*OUTPUT_OPTIONS, *OTHER_WRITES) if _uses(mode, k)]
    tried = refused = 0
    for role, (needs, extra) in _role_overrides(files).items():
        if not _uses(mode, needs):
            continue
        if role in CHECK_ROLES and mode in ("precision", "layerwise"):
            continue  # these modes judge with compare
        check = [] if role in CHECK_ROLES or role == "golden" else CHECK.get(mode, [])
        model = [f"model={files['model']}"] if mode_uses(mode, "model") else []
        if role == "calibration.cache":
            extra = [*INT8[mode], *extra]
        base = [*BASE[mode], *model, *check, *extra]
        for key in writes:
            if role in WRITE_EXCLUDES.get(key, ()):
                continue
            needs_set = [o for o in WRITE_NEEDS.get(key, {}).get(mode, []) if o not in base]
            if (needs_set or role == "calibration.cache") and not any(
                o.startswith(("inputs=", "data_loader=")) for o in base
            ):
                needs_set.append(f"data_loader={files['data_loader']}:load")  # int8 calibrates on real input
            r = run(*base, *needs_set, *_write_overrides(key, files[role], tmp_path), "overwrite=true")
            tried += 1
            if r.returncode != 0:  # refused for that file: a run that failed for another reason proves nothing
                errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
                assert len(errors) == 1 and "Traceback" not in r.stderr, (role, key, r.stderr[-3000:])
                assert files[role].name in errors[0], f"mode={mode} {key}= at the {role} file: {errors[0]}"
                refused += 1
            after = _sums(folder)
            changed = sorted(k for k in before if after.get(k) != before[k])
            assert not changed, f"mode={mode} {key}= at the {role} file lost {changed}: {r.stderr[-1500:]}"
    assert tried >= len(writes)
