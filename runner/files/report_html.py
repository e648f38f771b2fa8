"""``report.html``: a run's story on one self-contained page a person opens (no network, no script): the status
and answer in one line, the kept or reduced nodes, the trade-off picture and layerwise's figure inlined, each
node's errors where layerwise computed them, every check (candidate, verdict, seconds) and the commands that
reproduce and resume the run. Built from the run directory's own files (``summary.json``, ``replay.json``,
``ranking.json``, ``tradeoff.png``, ``layerwise.csv``, ``layerwise.png``), so it tells what they tell.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import os
import shlex
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from runner.jsonio import write_text_atomic

#: the most checks and layerwise rows listed (the files hold every one)
MOST_ROWS = 500

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
.status{font-size:1.15em;padding:.6em .8em;border-radius:4px;background:#eef6ee}
.bad{background:#fbeaea}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f3f3f3}
.pass{color:#176317}.fail{color:#a31515}pre{background:#f6f6f6;padding:.6em;overflow-x:auto}
img{max-width:100%;border:1px solid #ddd}
"""


def write_report(run_dir: Path, summary: Mapping[str, Any], overrides: Sequence[str]) -> Path:
    """Write ``run_dir/report.html`` from the run's files and its ``summary``.

    Args:
        run_dir: the run directory (its files are read; none is needed).
        summary: ``summary.json``'s record.
        overrides: the command line's overrides, for the commands that reproduce and resume the run.

    Returns:
        The page's path.

    Raises:
        OSError: the page cannot be written. ArtifactError: it is a file the run reads.
    """
    path = run_dir / "report.html"
    write_text_atomic(path, render(run_dir, summary, overrides), "the run's report")
    return path


def write_sweep_report(sweep_dir: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``sweep_dir/report.html``: one page over a multirun's jobs (``runner.run.sweep``'s rows), each job's
    headline and a link to its own page.

    Raises:
        OSError: the page cannot be written. ArtifactError: it is a file the run reads.
    """
    body = []
    for row in rows:
        job = str(row.get("job", ""))
        summary = sweep_dir / job / "summary.json"
        try:
            line = headline(json.loads(summary.read_text()))
        except (OSError, ValueError):
            line = str(row.get("status", ""))
        body.append({**row, "job": job, "answer": line})
    page = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>sweep of {len(rows)} runs</title>",
        f"<style>{STYLE}</style></head><body><h1>Sweep of {len(rows)} runs in {_e(sweep_dir.name)}</h1>",
        *_table("jobs", [*columns, "answer"], body),
        "<p>Each job's own page: "
        + ", ".join(f"<a href='{_e(r['job'])}/report.html'>{_e(r['job'])}</a>" for r in body)
        + "</p></body></html>\n",
    ]
    path = sweep_dir / "report.html"
    write_text_atomic(path, "".join(page), "the sweep's report")
    return path


def render(run_dir: Path, summary: Mapping[str, Any], overrides: Sequence[str]) -> str:
    """The page's HTML (``write_report``)."""
    mode = str(summary.get("mode", "run"))
    status = str(summary.get("status", "unknown"))
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(mode)}: {_e(status)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_e(mode)} run in {_e(run_dir.name)}</h1>",
        f"<p class='status{'' if status == 'ok' else ' bad'}' id='status'>{_e(headline(summary))}</p>",
    ]
    rows = _layerwise_rows(run_dir)
    parts += _nodes(summary, _ranks(run_dir), rows)
    for name, title in (("tradeoff.png", "The trade-off"), ("layerwise.png", "Errors node by node")):
        if (run_dir / name).is_file():
            data = base64.b64encode((run_dir / name).read_bytes()).decode()
            parts.append(f"<h2>{title}</h2><img alt='{name}' src='data:image/png;base64,{data}'>")
    parts += _layerwise(rows)
    parts += _checks(run_dir)
    parts += _commands(run_dir, overrides)
    parts.append("<h2>summary.json</h2><details><summary>every field</summary><pre>")
    parts.append(_e(json.dumps(summary, indent=2, default=str)) + "</pre></details></body></html>\n")
    return "".join(parts)


def headline(summary: Mapping[str, Any]) -> str:
    """The status and the answer in one line."""
    status = str(summary.get("status", "unknown"))
    verified = summary.get("answer_verified") or {}
    checked = f"{summary.get('checks', '?')} checks"
    if summary.get("kept_nodes") is not None:
        answer = f"{summary.get('kept')} of {summary.get('total')} nodes kept in float32"
        if summary.get("low_precision"):
            answer += f", the rest in {summary['low_precision']}"
    elif summary.get("reduced_nodes") is not None:
        answer = f"reduced to {len(summary['reduced_nodes'])} nodes"
    elif summary.get("first_divergence") is not None:
        first = summary["first_divergence"]
        answer = f"first divergence at {first.get('node') if isinstance(first, dict) else first}"
    else:
        answer = "no answer"
    proof = ""
    if isinstance(verified, Mapping) and "passed" in verified:
        proof = "; verified as written" if verified.get("passed") else "; NOT verified as written"
    where = f": {summary['output']}" if summary.get("output") and summary.get("kept_nodes") is not None else ""
    minimal = "" if summary.get("minimal", True) else " (not minimal: " + str(summary.get("minimal_why", "")) + ")"
    return f"{status}: {answer}{where}{proof}{minimal}, {checked}"


def _nodes(summary: Mapping[str, Any], ranks: Dict[str, int], rows: List[Dict[str, str]]) -> List[str]:
    nodes = summary.get("kept_nodes") or summary.get("reduced_nodes")
    if not nodes:
        return []
    errors = {r.get("node", ""): r.get("intro_rel_l2", "") for r in rows}
    title = "Nodes kept in float32" if summary.get("kept_nodes") is not None else "Nodes of the reduced model"
    out = [f"<h2>{title} ({len(nodes)})</h2><table id='nodes'><tr><th>node</th><th>op</th><th>rank</th>"]
    out.append("<th>introduced rel L2</th></tr>")
    for node in nodes:
        name = node.get("name", "") if isinstance(node, Mapping) else str(node)
        op = node.get("op", "") if isinstance(node, Mapping) else ""
        rank = ranks.get(name)
        out.append(
            f"<tr><td>{_e(name)}</td><td>{_e(op)}</td><td>{'' if rank is None else rank + 1}</td>"
            f"<td>{_e(errors.get(name, ''))}</td></tr>"
        )
    return [*out, "</table>"]


def _ranks(run_dir: Path) -> Dict[str, int]:
    """Each node's place in the run's first ranking by introduced error (``ranking.json``)."""
    try:
        rankings = json.loads((run_dir / "ranking.json").read_text())["rankings"]
        order = next(r["order"] for r in rankings if r.get("kind") == "introduced")
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return {}
    return {name: i for i, name in enumerate(order)}


def _layerwise_rows(run_dir: Path) -> List[Dict[str, str]]:
    try:
        with open(run_dir / "layerwise.csv", newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _layerwise(rows: List[Dict[str, str]]) -> List[str]:
    if not rows:
        return []
    columns = ("index", "node", "op", "acc_rel_l2", "intro_rel_l2", "acc_nan", "acc_inf", "passes")
    return [f"<h2>Layerwise errors ({len(rows)} nodes)</h2>", *_table("layerwise", columns, rows[:MOST_ROWS])]


def _checks(run_dir: Path) -> List[str]:
    try:
        iterations = json.loads((run_dir / "replay.json").read_text())["iterations"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    rows = []
    for it in iterations[:MOST_ROWS]:
        details = it.get("details") or {}
        verdict = "reused" if it.get("reused") else ("pass" if it.get("passed") else "FAIL")
        rows.append(
            {
                "iteration": it.get("iteration", ""),
                "candidate": it.get("label", ""),
                "verdict": verdict,
                "reason": it.get("reason") or it.get("error", ""),
                "seconds": details.get("check_s", ""),
            }
        )
    title = f"<h2>Checks ({len(iterations)})</h2>"
    return [title, *_table("checks", ("iteration", "candidate", "verdict", "reason", "seconds"), rows)]


def _commands(run_dir: Path, overrides: Sequence[str]) -> List[str]:
    mine = [o for o in overrides if not o.startswith(("hydra.run.dir=", "replay.load="))]
    here = f"cd {shlex.quote(os.getcwd())} && "  # the command's relative paths are the launch folder's
    again = here + shlex.join(["python", "-m", "runner", *mine])
    resume = here + shlex.join(["python", "-m", "runner", *mine, f"replay.load={run_dir.resolve() / 'replay.json'}"])
    return [
        "<h2>Commands</h2><p>Reproduce the run (a new run directory):</p>",
        f"<pre id='reproduce'>{_e(again)}</pre><p>Resume it: every verdict of its replay is taken, not checked again "
        "(a larger budget or none goes on from there):</p>",
        f"<pre id='resume'>{_e(resume)}</pre>",
    ]


def _table(name: str, columns: Iterable[str], rows: Iterable[Mapping[str, Any]]) -> List[str]:
    columns = list(columns)
    out = [f"<table id='{name}'><tr>" + "".join(f"<th>{_e(c)}</th>" for c in columns) + "</tr>"]
    for row in rows:
        cells = []
        for c in columns:
            value = str(row.get(c, ""))
            kind = {"pass": " class='pass'", "FAIL": " class='fail'"}.get(value, "")
            cells.append(f"<td{kind}>{_e(value)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return [*out, "</table>"]


def _e(value: Optional[Any]) -> str:
    return html.escape("" if value is None else str(value), quote=True)
