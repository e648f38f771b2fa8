"""Benchmark: reduce on large graphs, this tool (bisect and minimal markers) beside `polygraphy debug reduce`.

Usage: python benchmarks/scale.py [--sizes 5000 20000 100000] [--transformer-layers 24] [--polygraphy-timeout 900]

Each model holds one node named "culprit" (60% of the way along a chain; a Softmax in a
transformer-shaped graph); the check is `grep` on the candidate file, so the figures are the
tools' own costs. Per run: checks, wall time, start-up (to the first check: load, shape inference,
index), peak RSS of the tool's process, and the overhead per check beyond the check (the mean gap
between one check's end and the next one's start, measured by the check itself, and the median gap,
which leaves out the first candidates' one-time work). Polygraphy runs
where it finishes within its timeout (it needs the benchmark extra: pip install ".[benchmark]").
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import onnx
from _common import print_rows, runner_cmd
from graphs import chain, transformer

#: a check that fails while the file holds "culprit", and writes when it starts and ends
CHECK = 'date +%s.%N >> "$STAMPS"; ! grep -q culprit "$1"; r=$?; date +%s.%N >> "$STAMPS"; exit $r\n'


#: GNU time reports the peak RSS of the command alone (wait4 in this process would also count the pages
#: this process had when it forked)
TIME = shutil.which("time") or "/usr/bin/time"


def _run(cmd: List[str], cwd: Path, stamps: Path, timeout: float) -> Optional[Dict[str, float]]:
    """Run ``cmd``; wall seconds, peak RSS (MB, through GNU time), and the check timings; None on timeout."""
    stamps.write_text("")
    rss_file = stamps.with_name("rss.txt")
    if Path(TIME).is_file():
        cmd = [TIME, "-f", "%M", "-o", str(rss_file), *cmd]
    start, started_at = time.monotonic(), time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**os.environ, "STAMPS": str(stamps)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            return None
        time.sleep(0.05)
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
    times = [float(t) for t in stamps.read_text().split()]
    peak_kb = int(rss_file.read_text().split()[-1]) if rss_file.is_file() else usage.ru_maxrss
    starts, ends = times[0::2], times[1::2]
    gaps = [s - e for s, e in zip(starts[1:], ends[:-1])]
    return {
        "checks": len(starts),
        "wall_s": round(wall, 1),
        "startup_s": round(starts[0] - started_at, 1),
        "peak_rss_mb": round(peak_kb / 1024),
        "overhead_per_check_s": round(sum(gaps) / len(gaps), 3) if gaps else 0.0,
        # the typical candidate, without the first ones' one-time work (index edges, full validation, exports)
        "median_overhead_s": round(statistics.median(gaps), 3) if gaps else 0.0,
    }


def runner(model: Path, marker: str, work: Path, timeout: float) -> Optional[Dict[str, float]]:
    """This tool's reduce with ``marker``."""
    script = work / "check.sh"
    script.write_text(CHECK)
    check = f'checker.cmd="sh {script} {{artifact}}"'
    cmd = runner_cmd(
        "mode=reduce",
        f"marker={marker}",
        f"model={model}",
        check,
        f"output={work / 'out.onnx'}",
        f"hydra.run.dir={work / ('run_' + marker)}",
    )
    return _run(cmd, work, work / "stamps.txt", timeout)


def polygraphy(model: Path, work: Path, timeout: float) -> Optional[Dict[str, float]]:
    """`polygraphy debug reduce` with bisect (its default) and the same check."""
    exe = shutil.which("polygraphy")
    if exe is None:
        return None
    script = work / "check.sh"
    script.write_text(CHECK)
    cmd = [
        exe,
        "debug",
        "reduce",
        str(model),
        "-o",
        str(work / "poly.onnx"),
        "--check",
        "sh",
        str(script),
        "polygraphy_debug.onnx",
    ]
    return _run(cmd, work, work / "stamps.txt", timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=int, default=[5000, 20000, 100000])
    parser.add_argument("--transformer-layers", type=int, default=24)
    parser.add_argument("--markers", nargs="+", default=["bisect", "minimal"])
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run of this tool")
    parser.add_argument("--polygraphy-timeout", type=float, default=900, help="seconds per Polygraphy run")
    parser.add_argument("--polygraphy-max-nodes", type=int, default=None, help="skip Polygraphy on larger models")
    args = parser.parse_args()
    layers = args.transformer_layers
    models: List[Tuple[str, Callable[[], onnx.ModelProto]]] = [
        (f"chain {n}", functools.partial(chain, n, int(n * 0.6))) for n in args.sizes
    ]
    models.append((f"transformer {layers} layers", functools.partial(transformer, layers, int(layers * 0.7))))
    rows: List[Dict[str, Any]] = []
    for label, build in models:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            path = work / "model.onnx"
            model = build()
            onnx.save(model, path)
            base: Dict[str, Any] = {"model": label, "nodes": len(model.graph.node)}
            for marker in args.markers:
                result = runner(path, marker, work, args.timeout)
                rows.append({**base, "tool": f"runner {marker}", **(result or {"checks": "timeout"})})
                print(rows[-1], file=sys.stderr, flush=True)
            if args.polygraphy_max_nodes is not None and len(model.graph.node) > args.polygraphy_max_nodes:
                rows.append({**base, "tool": "polygraphy bisect", "checks": "not run"})
                continue
            result = polygraphy(path, work, args.polygraphy_timeout)
            rows.append({**base, "tool": "polygraphy bisect", **(result or {"checks": "did not finish"})})
            print(rows[-1], file=sys.stderr, flush=True)
    for r in rows:
        for key in ("wall_s", "startup_s", "peak_rss_mb", "overhead_per_check_s", "median_overhead_s"):
            r.setdefault(key, "-")
    print_rows("Reduce at scale (check: grep on the candidate file)", rows)


if __name__ == "__main__":
    main()
