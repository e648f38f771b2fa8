"""The short final table printed after a run (the full record is in summary.json)."""

from __future__ import annotations

from typing import Any, Dict, Iterable

#: long fields, in summary.json only (layerwise prints its own table of top_introduced)
SKIP = {"kept_nodes", "top_introduced", "last_check_outputs", "answer_outputs"}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        text = ", ".join(map(str, value))
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(value, dict):
        return _fmt([f"{k}={v}" for k, v in value.items()])
    return str(value)


def format_table(rows: Iterable[tuple[str, Any]]) -> str:
    """Two aligned columns, one ``key  value`` per line."""
    rows = [(k, _fmt(v)) for k, v in rows]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def print_table(summary: Dict[str, Any]) -> None:
    """Print the summary's scalar fields as a table on stdout."""
    print(format_table((k, v) for k, v in summary.items() if k not in SKIP))
