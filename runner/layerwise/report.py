"""What ``mode=layerwise`` writes: ``layerwise.csv``, the printed table, ``layerwise.png`` and the
summary fields (``first_divergence``, ``top_introduced``)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from runner.files.figures import save_figure
from runner.jsonio import write_csv_atomic
from runner.layerwise.compute import NodeRow
from runner.layerwise.ranking import error_key

log = logging.getLogger(__name__)

#: the statistics each error has in the CSV, the table and the summary
STATS = ("max_abs", "max_rel", "rel_l2", "cosine", "sqnr_db", "nan", "inf")


def ranked(rows: Sequence[NodeRow]) -> List[NodeRow]:
    """Rows by introduced error, largest first, by the rule precision's searches rank by
    (``runner.layerwise.ranking.error_key``); rows never run alone are left out."""
    return sorted((r for r in rows if r.introduced is not None), key=error_key, reverse=True)


def _stats(d: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    return {k: d[k] for k in STATS} | {"new_nonfinite": d["new_nonfinite"]} if d else {}


def describe(row: NodeRow) -> Dict[str, Any]:
    """A row for ``summary.json``: name, op, position, tensor, magnitude and both errors."""
    return {
        "node": row.node,
        "op": row.op,
        "index": row.index,
        "tensor": row.tensor,
        "magnitude": row.magnitude,
        "weights": row.weights,
        "in_range": row.in_range,
        "saturated_inputs": row.saturated,
        "accumulated": _stats(row.accumulated),
        "introduced": _stats(row.introduced),
        "absorbed_by": row.absorbed_by,
    }


def diverges(row: NodeRow) -> bool:
    """Whether a row's accumulated error breaks the checker's tolerance."""
    return bool(row.accumulated) and not row.passes


def first_divergence(rows: Sequence[NodeRow]) -> Optional[NodeRow]:
    """The first row, in topological order, whose accumulated error breaks the tolerance and reaches
    a graph output (not ``absorbed_by`` another node), or None."""
    return next((r for r in rows if diverges(r) and r.absorbed_by is None), None)


def absorbed(rows: Sequence[NodeRow]) -> List[Dict[str, Any]]:
    """The diverging rows whose error is absorbed on the way, for ``summary.json``: node, op,
    position, the tensor and its accumulated error, and the node that absorbs it."""
    return [
        {"node": r.node, "op": r.op, "index": r.index, "tensor": r.tensor, "accumulated": _stats(r.accumulated)}
        | {"absorbed_by": r.absorbed_by}
        for r in rows
        if diverges(r) and r.absorbed_by is not None
    ]


def write_csv(path: Path, rows: Sequence[NodeRow]) -> None:
    """One line per node (atomically replaced): position, node, op, outputs, tensor, magnitude,
    weights, in_range, passes, then ``acc_<stat>`` and ``intro_<stat>`` for each of ``STATS``.

    Raises:
        OSError: the file cannot be written.
    """
    header = ["index", "node", "op", "outputs", "tensor", "magnitude", "weights", "in_range", "passes"]
    header += [f"acc_{s}" for s in STATS] + [f"intro_{s}" for s in STATS] + ["absorbed_by"]
    lines: List[List[Any]] = [list(header)]
    for r in rows:
        acc, intro = r.accumulated or {}, r.introduced or {}
        lines.append(
            [r.index, r.node, r.op, ";".join(r.outputs), r.tensor]
            + [f"{r.magnitude:.6g}", f"{r.weights:.6g}", r.in_range, r.passes]
            + [_cell(acc.get(s)) for s in STATS]
            + [_cell(intro.get(s)) for s in STATS]
            + [r.absorbed_by or ""]
        )
    write_csv_atomic(path, lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def table(rows: Sequence[NodeRow], top: int, first: Optional[NodeRow]) -> str:
    """The printed table: the ``top`` nodes by introduced error, and the first divergence."""
    lines = [
        f"{'#':>5}  {'node':<36} {'op':<20} {'|ref| max':>10} {'|w| max':>9} "
        f"{'introduced rel L2':>18} {'accumulated rel L2':>19}"
    ]
    for r in ranked(rows)[:top]:
        intro = r.introduced or {}
        flag = "" if r.in_range else "  out of range"
        nonfinite = f" ({intro['new_nonfinite']} NaN/Inf)" if intro.get("new_nonfinite") else ""
        lines.append(
            f"{r.index:>5}  {r.node[:36]:<36} {r.op[:20]:<20} {r.magnitude:>10.4g} {r.weights:>9.3g} "
            f"{intro.get('rel_l2', 0):>18.4g} "
            f"{r.accumulated.get('rel_l2', 0):>19.4g}{nonfinite}{flag}"
        )
    if first is not None:
        lines.append(f"first divergence: {first.node} ({first.op}) at #{first.index}, tensor {first.tensor}")
    else:
        lines.append("first divergence: none (no error outside tolerance reaches an output)")
    gone = [r for r in rows if diverges(r) and r.absorbed_by is not None]
    if gone:
        lines.append(
            f"absorbed: {len(gone)} node(s) diverge but their error does not reach an output, "
            f"e.g. {gone[0].node} ({gone[0].op}) absorbed by {gone[0].absorbed_by}"
        )
    return "\n".join(lines)


def plot(path: Path, rows: Sequence[NodeRow], first: Optional[NodeRow], top: Sequence[NodeRow]) -> None:
    """``layerwise.png``: accumulated and introduced relative L2 error along the topological order
    (log scale; NaN/Inf drawn at the top), the first divergence and the top nodes marked.

    Raises:
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(kind: str) -> List[float]:
        out = []
        for r in rows:
            d = getattr(r, kind) or {}
            v = d.get("rel_l2", math.nan)
            out.append(math.inf if d.get("new_nonfinite") else v)
        return out

    acc, intro = series("accumulated"), series("introduced")
    finite = [v for v in acc + intro if v == v and v not in (math.inf,) and v > 0]
    floor = min(finite) / 10 if finite else 1e-8
    ceiling = max(finite) * 10 if finite else 1.0
    x = [r.index for r in rows]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.plot(x, [_clip(v, floor, ceiling) for v in acc], label="accumulated", linewidth=1)
    ax.plot(x, [_clip(v, floor, ceiling) for v in intro], label="introduced", linewidth=1, alpha=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("node (topological order)")
    ax.set_ylabel("relative L2 error")
    if first is not None:
        ax.axvline(first.index, color="red", linestyle="--", linewidth=1, label=f"first divergence: {first.node}")
    for r in top[:5]:
        y = _clip(intro[r.index] if r.index < len(intro) else math.nan, floor, ceiling)
        ax.annotate(r.node, (r.index, y), fontsize=7, rotation=30, xytext=(3, 3), textcoords="offset points")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def _clip(v: float, floor: float, ceiling: float) -> float:
    if v != v:
        return math.nan
    return min(max(v, floor), ceiling)
