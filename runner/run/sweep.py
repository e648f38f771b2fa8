"""After a Hydra multirun (``python -m runner -m ...``), print one table comparing the runs.

Registered as a Hydra callback in ``conf/config.yaml``; reads each job's ``summary.json`` from
the sweep directory, so it works the same with the basic launcher (serial) and the joblib
launcher (parallel, ``hydra/launcher=joblib``). The table is also saved as ``sweep.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.files.report_html import write_sweep_report
from runner.files.rundir import SWEEP_NAMES, record_run_dir
from runner.jsonio import write_json_atomic

log = logging.getLogger(__name__)

COLUMNS = ["job", "overrides", "status", "checks", "kept", "total", "nodes_after", "wall_s"]


def collect_runs(sweep_dir: Path) -> List[Dict[str, Any]]:
    """One row per job directory under ``sweep_dir`` that holds a summary.json, in job order."""
    rows = []
    for summary in sorted(sweep_dir.glob("*/summary.json"), key=lambda p: (len(p.parent.name), p.parent.name)):
        data = json.loads(summary.read_text())
        overrides_file = summary.parent / ".hydra" / "overrides.yaml"
        overrides = ""
        if overrides_file.is_file():
            lines = [line[2:].strip() for line in overrides_file.read_text().splitlines() if line.startswith("- ")]
            shown = ("mode", "marker", "direction", "precision", "low_precision", "checker.backend")
            overrides = " ".join(line for line in lines if line.split("=")[0] in shown)
        rows.append({"job": summary.parent.name, "overrides": overrides, **{k: data.get(k, "") for k in COLUMNS[2:]}})
    return rows


def format_rows(rows: List[Dict[str, Any]]) -> str:
    """Rows as an aligned text table (columns with no values are left out)."""
    cols = [c for c in COLUMNS if any(str(r.get(c, "")) != "" for r in rows)]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


class SweepTable(Callback):
    """Hydra callback: at the end of a multirun, print and save the comparison table, and end the
    process with exit code 2 when any job did not finish ok (jobs of a parallel launcher report
    only through their summaries)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Read every job's summary and print the table (nothing when no job wrote one)."""
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect_runs(sweep_dir)
        if not rows:
            return
        table = format_rows(rows)
        print(f"\nSweep of {len(rows)} runs ({sweep_dir}):\n{table}", flush=True)
        write_json_atomic(sweep_dir / "sweep.json", rows, "the sweep's table")
        write_sweep_report(sweep_dir, rows, COLUMNS)
        record_run_dir(sweep_dir, SWEEP_NAMES, ())
        if any(r["status"] != "ok" for r in rows):  # parallel jobs report through their summaries
            raise SystemExit(2)
