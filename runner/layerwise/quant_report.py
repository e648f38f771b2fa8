"""What ``mode=layerwise`` writes about a QDQ target's quantization points: ``quantization.csv``
and the ``quantization`` summary field (``PairRow``s of ``runner.layerwise.pairs``).

A pair read only by Relu or Clip may clip far more than its SQNR suggests is harmless: ONNX
Runtime's quantizer gives such a tensor the range of the activation's output (its
``adjust_tensor_ranges``), so what the pair cuts off the activation would cut off anyway. Those
pairs are in the CSV but not among the worst pairs of the summary.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from runner.jsonio import write_csv_atomic
from runner.layerwise.pairs import PairRow

#: readers that clip their input themselves
CLIPPING_READERS = frozenset({"Relu", "Clip"})


def _sqnr(row: PairRow) -> float:
    """The pair's lower SQNR: the tensor's, or its worst channel's."""
    values = [v for v in (row.error.get("sqnr_db"), row.channel_sqnr_db) if v is not None]
    return min(values) if values else math.inf


def write_pairs_csv(path: Path, rows: Sequence[PairRow]) -> None:
    """One line per Q/DQ pair (atomically replaced): tensor, kind, dequantized tensor, readers,
    sqnr_db, channel_sqnr_db (the worst channel's), rel_l2, max_abs, cosine, clipped (fraction of
    values past the scale's range).

    Raises:
        OSError: the file cannot be written.
    """
    lines: List[List[Any]] = [
        [
            "tensor",
            "kind",
            "dequantized",
            "readers",
            "sqnr_db",
            "channel_sqnr_db",
            "rel_l2",
            "max_abs",
            "cosine",
            "clipped",
        ]
    ]
    for r in rows:
        e = r.error
        sqnr, channel = e.get("sqnr_db"), r.channel_sqnr_db
        lines.append(
            [
                r.tensor,
                r.kind,
                r.dequantized,
                ";".join(r.readers),
                "" if sqnr is None else f"{sqnr:.4g}",
                "" if channel is None else f"{channel:.4g}",
                f"{e['rel_l2']:.6g}",
                f"{e['max_abs']:.6g}",
                f"{e['cosine']:.6g}",
                f"{r.clipped:.4g}",
            ]
        )
    write_csv_atomic(path, lines)


def _describe(row: PairRow) -> Dict[str, Any]:
    return {
        "tensor": row.tensor,
        "kind": row.kind,
        "readers": row.readers,
        "sqnr_db": row.error.get("sqnr_db"),
        "channel_sqnr_db": row.channel_sqnr_db,
        "rel_l2": row.error["rel_l2"],
        "clipped": row.clipped,
    }


def pair_summary(rows: Sequence[PairRow], top: int, ops: Mapping[str, str] | None = None) -> Dict[str, Any]:
    """``summary.json``'s ``quantization`` field: counts, and the ``top`` activations and weights
    with the lowest SQNR, the tensor's or its worst channel's (pairs read only by Relu/Clip left out
    of the activations, see the module docstring).

    Args:
        rows: the compared pairs.
        top: how many of each kind to list.
        ops: ``{node name: op type}`` of the target, to tell the clipping readers.
    """
    ops = ops or {}
    acts = [r for r in rows if r.kind == "activation"]
    judged = [r for r in acts if not (r.readers and all(ops.get(n) in CLIPPING_READERS for n in r.readers))]
    weights = [r for r in rows if r.kind == "weight"]
    worst: List[PairRow] = sorted(judged, key=_sqnr)[:top]
    return {
        "pairs": len(rows),
        "activations": len(acts),
        "weights": len(weights),
        "worst_activations": [_describe(r) for r in worst],
        "worst_weights": [_describe(r) for r in sorted(weights, key=_sqnr)[:top]],
    }
