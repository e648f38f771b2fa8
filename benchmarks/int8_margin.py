"""Do int8 answers found on CPU hold where they deploy? Issue 53's five tolerances with and without margin.

The detector, TensorRT's placement, calibrated and judged on the four rendered pages, ``checker=compare``
with a rel L2 bound on the text map (``checker.check_error_stat=rel_l2 checker.atol=0``), ``marker=minimal``,
searched on ONNX Runtime's CPU provider: once with int8's default margin (0.33) and once with
``checker.margin=0`` (the answers of stop 49, which an H100's CUDA provider moved past their tolerance).
Each written answer is verified at the full tolerance on both CPU optimization levels and, where
onnxruntime-gpu runs, on the CUDA provider (``checker.verify_on``'s default): ``summary.json``'s
``answer_verified.verified_on``. A run whose answer fails there ends "answer not verified" (exit 3).

    python benchmarks/int8_margin.py [OUT_DIR] [--margins 0.33,0] [--rtols 0.03,0.04,0.05,0.06,0.08]

Pages: rendered with Pillow (``examples/text_pages.py``), or read from ``$BENCH_PAGES`` (an ``.npz`` of the
four ``x`` arrays, ``numpy.savez(path, *pages)``) on a machine without Pillow.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx"


def pages() -> Iterator[Dict[str, np.ndarray]]:
    """The four rendered pages as feeds (``data_loader=benchmarks/int8_margin.py:pages``)."""
    saved = os.environ.get("BENCH_PAGES")
    if saved:
        with np.load(saved) as found:
            for name in sorted(found.files, key=lambda n: int(n.split("_")[1])):
                yield {"x": found[name]}
        return
    sys.path.insert(0, str(ROOT))
    from examples.text_pages import detector_pages

    yield from detector_pages()


def _kept(summary: Dict) -> int:
    """Nodes the answer keeps float: ``kept_nodes``, or for an answer not stood behind its ``size``."""
    if "kept_nodes" in summary:
        return len(summary["kept_nodes"])
    found = re.search(r"(\d+) of \d+ nodes", summary["answer_verified"]["size"])
    assert found is not None, summary["answer_verified"]["size"]
    return int(found.group(1))


def main() -> None:
    from _common import print_rows, runner_cmd, timed  # here: the module is also read as a data loader script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=None)
    parser.add_argument("--margins", default="0.33,0")
    parser.add_argument("--rtols", default="0.03,0.04,0.05,0.06,0.08")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="int8_margin_"))
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict] = []
    for margin in args.margins.split(","):
        for rtol in args.rtols.split(","):
            run_dir, answer = out / f"m{margin}_r{rtol}", out / f"m{margin}_r{rtol}.onnx"
            wall, proc = timed(
                runner_cmd(
                    "mode=precision",
                    "low_precision=int8",
                    "marker=minimal",
                    f"model={DETECTOR}",
                    f"data_loader={Path(__file__).resolve()}:pages",
                    "checker=compare",
                    "checker.check_error_stat=rel_l2",
                    "checker.atol=0",
                    f"checker.rtol={rtol}",
                    f"checker.margin={margin}",
                    f"output={answer}",
                    f"hydra.run.dir={run_dir}",
                ),
                ROOT,
                {},
            )
            summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
            verified = summary.get("answer_verified") or {}
            on = verified.get("verified_on", {})
            if proc.returncode not in (0, 3) or not on:
                sys.exit(f"margin {margin}, rtol {rtol}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
            row = {
                "rtol": float(rtol),
                "margin": float(margin),
                "kept": _kept(summary),
                "checks": summary.get("checks"),
                "wall_s": round(wall, 1),
                "status": summary.get("status"),
            }
            for name, facts in on.items():
                value = max(facts["statistic"].values()) if facts["statistic"] else None
                row[name] = f"{value:.4f}{'' if facts['passed'] else ' FAIL'}" if value is not None else "n/a"
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_rows("int8 answers found on CPU, verified at the full tolerance (rel L2 of the text map, worst page)", rows)


if __name__ == "__main__":
    main()
