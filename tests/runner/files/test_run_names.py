"""Every name a run writes in its run directory, against a user's file of that name (issue 74): generated from what
each mode really writes, not from a list. A run of each mode goes first in a fresh directory; then, for every entry
it left there, a folder of the user's holding a file (or folder) of that name is given as the run directory of the
same run: it is refused in one line, or the run picks another name, and every file of the user's keeps its sha256.
A name a run writes that ``runner.files.rundir`` does not declare, and that the run replaces, fails here."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, List

import numpy as np
import onnx
import pytest

from runner.files.rundir import RUN_NAMES, RUN_PATTERNS, _run_name
from runner.write_guard import OWN_NAMES
from tests.helpers.checks import python_check
from tests.helpers.models import chain_model, overflow_model


def _sums(folder: Path) -> Dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _cases(tmp_path: Path) -> Dict[str, List[str]]:
    """The runs, one per mode and per way of writing into the run directory, on small real graphs."""
    chain, overflow, x = tmp_path / "chain.onnx", tmp_path / "overflow.onnx", tmp_path / "x.npz"
    onnx.save(chain_model(6), chain)
    onnx.save(overflow_model(), overflow)
    np.savez(x, x=np.full((1, 4), 300, np.float32))
    fp16 = [f"model={overflow}", "checker=compare", "checker.backend=fp16_emulation", f"inputs={x}"]
    return {
        "reduce": ["mode=reduce", f"model={chain}", *python_check("n3"), "artifacts.keep_intermediate=true"],
        "reduce_compare": ["mode=reduce", *fp16],
        "precision": ["mode=precision", "marker=minimal", *fp16],
        "layerwise": ["mode=layerwise", f"model={overflow}", f"inputs={x}"],
        "repeat": ["mode=repeat", f"model={chain}", "checker.cmd=true", "until=2"],
    }


def _entries(run_dir: Path) -> List[str]:
    """The top-level entries a run left in its directory, the tool's own bookkeeping left out."""
    return sorted(name for name in (p.name for p in run_dir.iterdir()) if name not in OWN_NAMES)


def _plant(folder: Path, name: str, like: Path) -> None:
    """A user's entry called ``name`` in ``folder``: a folder holding a file where the run made a folder, else a
    file of the user's own bytes."""
    if like.is_dir():
        (folder / name).mkdir(parents=True)
        (folder / name / "mine.txt").write_text(f"the user's own {name}\n")
    else:
        (folder / name).write_text(f"the user's own {name}\n")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce", "reduce_compare", "precision", "layerwise", "repeat"])
def test_every_name_a_run_writes_in_its_directory_spares_a_users_file_of_that_name(run, tmp_path, mode):
    args = _cases(tmp_path)[mode]
    first = run(*args, run_dir=tmp_path / "fresh")
    assert first.returncode == 0, first.stderr[-2000:]
    names = _entries(first.run_dir)
    assert {"summary.json", "runner.log"} <= set(names)
    for name in names:
        folder = tmp_path / f"mine_{mode}_{name}"
        folder.mkdir()
        _plant(folder, name, first.run_dir / name)
        before = _sums(folder)
        again = run(*args, run_dir=folder)
        if again.returncode != 0:
            errors = [line for line in again.stderr.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and "Traceback" not in again.stderr, again.stderr[-2000:]
            assert name in errors[0] and "no run of this tool wrote" in errors[0], errors[0]
        else:
            assert not _run_name(name, RUN_NAMES, RUN_PATTERNS), f"{name} is declared, yet the run took the folder"
        after = _sums(folder)
        assert {k: after.get(k) for k in before} == before, f"{mode}: the user's {name} changed"


def test_a_run_directory_that_held_a_run_may_be_reused_and_a_users_file_there_is_refused(run, tmp_path, chain):
    """A folder that held a finished run is the tool's (its names recorded in the ledger): ``reuse_run_dir=true``
    replaces its files. A user's ``ranking.json`` put there since is refused, as in any folder."""
    folder = tmp_path / "runs"
    first = run("mode=reduce", f"model={chain}", *python_check("n3"), "output=a.onnx", run_dir=folder)
    assert first.returncode == 0, first.stderr[-2000:]
    reused = run(
        "mode=reduce", f"model={chain}", *python_check("n3"), "output=b.onnx", "reuse_run_dir=true", run_dir=folder
    )
    assert reused.returncode == 0, reused.stderr[-2000:]
    (folder / "ranking.json").write_text("{}\n")
    refused = run(
        "mode=reduce", f"model={chain}", *python_check("n3"), "output=c.onnx", "reuse_run_dir=true", run_dir=folder
    )
    assert refused.returncode == 2 and "ranking.json" in refused.stderr, refused.stderr[-2000:]
    assert (folder / "ranking.json").read_text() == "{}\n"


def test_the_model_named_like_the_iteration_artifact_in_its_own_folder_as_run_directory_is_kept(run, tmp_path):
    """Issue 74, case 1: ``model=iter_artifact.onnx hydra.run.dir=.`` deleted the model."""
    folder = tmp_path / "work"
    folder.mkdir()
    model = folder / "iter_artifact.onnx"
    onnx.save(chain_model(4), model)
    before = _sums(folder)
    r = run("mode=reduce", f"model={model}", *python_check("n2"), run_dir=folder, cwd=folder)
    assert r.returncode == 2 and "iter_artifact.onnx" in r.stderr, r.stderr[-2000:]
    assert _sums(folder) == before


def test_a_run_into_a_users_folder_names_its_answer_beside_the_users_files(run, tmp_path, chain):
    """An output inside a folder given as the run directory is held to the output rule: the default answer
    beside a user's ``reduced.onnx`` takes the next free name."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "reduced.onnx").write_bytes(b"the user's own model")
    r = run("mode=reduce", f"model={chain}", *python_check("n2"), run_dir=folder, cwd=folder)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (folder / "reduced.onnx").read_bytes() == b"the user's own model"
    assert Path(r.summary["output"]).name == "reduced_1.onnx"
