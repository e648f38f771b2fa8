"""Every ``python -m runner`` command of the README and ``docs/`` runs as written and ends well.

Each document's commands run in order, in a directory of their own (``../shared`` and ``examples``
linked in), in this process. The files a command names but the documents do not make (``model.onnx``,
``check.py``, ``x.npz``, ...) are made here from the bundled models, each standing for what a user
would have. The few commands that need what this machine cannot have (TensorRT, an SSD export) are
listed in ``CANNOT_RUN`` with the reason, and the test checks that nothing else is left out.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
import onnx
import pytest

from tests.helpers.inprocess import run_in_process
from tests.helpers.int8 import introduced_share
from tests.helpers.models import CLASSIFIER, perturbed_classifier

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: words of a command -> why this machine cannot run it
CANNOT_RUN = {
    "ssdlite.onnx": "needs the SSD-lite export of docs/detection.md (torchvision, on the GPU machine)",
    "mode=build": "builds TensorRT engines, which cannot be installed here",
    "mode=diff_tactics dir=builds": "reads the tactic records of mode=build's TensorRT engines",
    "python -m runner -m": "a sweep whose '...' stands for the user's own keys",
}

#: what check.py and run_backend.sh do: fail while the candidate holds this node (the README's example)
NEEDED = "HardSigmoid@2"
CHECK_PY = f"""import sys
import onnx

args = sys.argv[1:]
if "--log" in args:
    at = args.index("--log")
    with open(args[at + 1], "w") as log:
        log.write("checked " + args[0])
    del args[at : at + 2]
names = {{n.name for n in onnx.load(args[0]).graph.node}}
sys.exit(1 if "{NEEDED}" in names else 0)
"""
RUN_BACKEND = """#!/bin/sh
# a flaky backend: every second run fails, leaving its log and dump
count=$(cat runs 2>/dev/null || echo 0); count=$((count + 1)); echo $count > runs
echo "run $count" > out.log; echo dump > dump.bin
[ $((count % 2)) -eq 1 ]
"""


def _commands(doc: Path) -> Iterator[str]:
    """The shell lines of ``doc``'s bash blocks, continuations joined, comments dropped."""
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                yield re.sub(" +", " ", line)


def _int8_as_tensorrt_places_it(summary: Dict[str, Any], work: Path) -> None:
    """docs/int8.md: with Q/DQ where TensorRT fuses them (Conv inputs and weights, pools, resizes, residual
    Adds) the fully quantized detector keeps its text map (IoU >= 0.9 on every page): no node kept, in 2
    checks. NVIDIA ModelOpt 0.47 (quantize_mode=int8) quantizes the same 146 nodes' inputs: 204 Q/DQ."""
    from examples.text_pages import text_map_iou

    assert summary["kept"] == 0 and summary["checks"] == 2
    written = str(work / summary["output"])
    ops = [n.op_type for n in onnx.load(written).graph.node]
    assert ops.count("DequantizeLinear") == 204 and ops.count("QuantizeLinear") == 140
    assert text_map_iou(written, str(ROOT / "examples/ch_PP-OCRv4_det_infer.onnx"))


def _int8_layerwise_names_what_precision_keeps(summary: Dict[str, Any], work: Path) -> None:
    """docs/int8.md: with the CPU placement every one of the detector's 330 compute nodes gets its introduced
    error, and the top two are p2o.Conv.3 and p2o.BatchNormalization.1, the node the precision search keeps
    (tests/strategies/test_precision_int8.py); the first divergence is p2o.Conv.3, with a finite error."""
    share, _ = introduced_share(summary, Path(summary["csv"]))
    assert summary["nodes"] == 330 and share >= 0.95
    assert [t["node"] for t in summary["top_introduced"][:2]] == ["p2o.Conv.3", "p2o.BatchNormalization.1"]
    divergence = summary["first_divergence"]
    assert divergence["node"] == "p2o.Conv.3" and np.isfinite(divergence["accumulated"]["rel_l2"])


#: words of a command -> what its summary must hold beyond a clean ending (the figures the document gives)
EXPECTED: Dict[str, Callable[[Dict[str, Any], Path], None]] = {
    "low_precision=int8 marker=minimal model=examples/ch_PP-OCRv4_det_infer.onnx": _int8_as_tensorrt_places_it,
    "checker.low_precision=int8 model=examples/ch_PP-OCRv4_det_infer.onnx": _int8_layerwise_names_what_precision_keeps,
}


def _cases() -> List[Tuple[str, List[str]]]:
    """``(document, its commands)`` for every document with a runner command this machine can run."""
    cases = [(doc.name, list(_commands(doc))) for doc in DOCS]
    return [(name, lines) for name, lines in cases if any(_runnable(line) for line in lines)]


def _runnable(line: str) -> bool:
    return line.startswith("python -m runner") and not _reason(line)


def _made_files(work: Path) -> None:
    """The files the documents' commands name and leave to the user, made from the bundled classifier."""
    model = onnx.load(CLASSIFIER)
    onnx.save(model, work / "model.onnx")
    onnx.save(model, work / "model_fp32.onnx")
    onnx.save(perturbed_classifier()[0], work / "model_bad.onnx")  # the README's reduce against golden values
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(CLASSIFIER), keep_io_types=True), work / "model_fp16.onnx")
    np.savez(work / "x.npz", x=np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32))
    (work / "check.py").write_text(CHECK_PY)
    script = work / "run_backend.sh"
    script.write_text(RUN_BACKEND)
    script.chmod(0o755)


def _quantized_detector(path: Path) -> None:
    """docs/int8.md's ``det_qdq.onnx``: the detector as a user's quantizer leaves it, here ONNX Runtime's
    ``quantize_static`` (QDQ, per-channel weights, the rendered pages)."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    from examples.text_pages import detector_pages
    from runner.lowp.quantize import prepare_int8
    from tests.helpers.int8 import calibration_reader

    source = path.with_name("det_opset13.onnx")
    onnx.save(prepare_int8(onnx.load(ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx")), source)
    reader = calibration_reader(detector_pages())
    quantize_static(str(source), str(path), reader, quant_format=QuantFormat.QDQ, per_channel=True)


def _sandbox(tmp_path: Path) -> Path:
    """``tmp_path/work``, with ``examples`` and ``../shared`` as the repository root sees them."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "shared").symlink_to((ROOT / ".." / "shared").resolve())
    _made_files(work)
    return work


def test_every_command_is_run_or_said_why_not():
    """The skip list names only commands that exist, and every other runner command is run below."""
    lines = [line for doc in DOCS for line in _commands(doc)]
    for words in CANNOT_RUN:
        assert any(words in line for line in lines), f"CANNOT_RUN names {words!r}, which no document holds"
    assert sum(_runnable(line) for line in lines) >= 15


def _reason(line: str) -> str:
    return next((why for words, why in CANNOT_RUN.items() if words in line), "")


@pytest.mark.slow
@pytest.mark.parametrize("doc, commands", _cases(), ids=[name for name, _ in _cases()])
def test_the_documents_commands_run_as_written(doc, commands, tmp_path, request):
    work = _sandbox(tmp_path)
    if any("quantized_model=det_qdq.onnx" in line for line in commands):
        _quantized_detector(work / "det_qdq.onnx")  # 4 s: made for the document that names it
    elsewhere = {line for name, lines in _cases() if name != doc for line in lines} if doc == "README.md" else set()
    ran = 0
    for i, line in enumerate(commands):
        if _reason(line) or line.startswith(("pip install", "python -m venv")) or line == "python -m pytest":
            continue  # the quick start's ``python -m venv ... && python -m runner`` is tests/test_readme.py's
        if line in elsewhere and _runnable(line):
            ran += 1  # the README's copy of a command its document runs
            continue
        argv = shlex.split(line)
        if argv[:2] == ["python", "-c"]:
            subprocess.run([sys.executable, *argv[1:]], cwd=work, check=True, timeout=60)
            continue
        assert argv[:3] == ["python", "-m", "runner"], line
        overrides = argv[3:]
        if any("HOST:8786" in o for o in overrides):
            address = request.getfixturevalue("dask_cluster")
            overrides = [o.replace("tcp://HOST:8786", address) for o in overrides]
        result = run_in_process(tmp_path, f"run{i}", *overrides, cwd=work)
        assert result.returncode == 0, f"{doc}: {line}\n{result.stderr[-1500:]}"
        assert result.summary["status"] == "ok", line
        for words, expected in EXPECTED.items():
            if words in line:
                expected(result.summary, work)
        ran += 1
    assert ran == sum(_runnable(line) for line in commands)


@pytest.mark.slow  # two shell scripts and a Python process: about 1.8 s on 2 cores
def test_the_sandbox_holds_what_the_commands_name(tmp_path):
    work = _sandbox(tmp_path)
    assert (work / "../shared/models/ch_PP-OCRv4_det_infer.onnx").resolve().is_file()
    assert (work / "examples/check_node.py").is_file()
    proc = subprocess.run([sys.executable, "check.py", "model.onnx", "--log", "l.log"], cwd=work, timeout=60)
    assert proc.returncode == 1 and (work / "l.log").is_file(), "the whole model holds the needed node"
    first = subprocess.run(["./run_backend.sh"], cwd=work, env=dict(os.environ), timeout=10)
    second = subprocess.run(["./run_backend.sh"], cwd=work, env=dict(os.environ), timeout=10)
    assert (first.returncode, second.returncode) == (0, 1) and (work / "dump.bin").is_file()
    shutil.rmtree(work)
