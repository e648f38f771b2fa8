"""Tactic records on disk: read Polygraphy's TacticReplayData JSON and our timing-cache records.

Pure Python: diff_tactics needs no TensorRT. A record maps each layer (TensorRT 10: the layer
name; TensorRT 11: the timing-cache key) to one tactic, given as a canonical string.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from runner.errors import ConfigError

#: the "format" value of records written from TensorRT 11's editable timing cache
TIMING_CACHE_FORMAT = "runner-timing-cache-tactics/1"


def tensor_info(
    dtype: str, strides: Sequence[int], vectorized_dim: Optional[int], components_per_element: Optional[int]
) -> Dict[str, Any]:
    """One tensor's format in Polygraphy's TensorInfo layout (dtype as ``str(trt.DataType)``)."""
    return {
        "polygraphy_class": "TensorInfo",
        "dtype": dtype,
        "strides": list(strides),
        "vectorized_dim": vectorized_dim,
        "components_per_element": components_per_element,
    }


def algorithm(
    implementation: int, tactic: int, inputs: List[Dict[str, Any]], outputs: List[Dict[str, Any]]
) -> Dict[str, Any]:
    """One layer's chosen algorithm in Polygraphy's Algorithm layout."""
    return {
        "polygraphy_class": "Algorithm",
        "implementation": int(implementation),
        "tactic": int(tactic),
        "inputs": inputs,
        "outputs": outputs,
    }


def replay_record(layers: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """A whole record in Polygraphy's TacticReplayData layout: ``{layer name: algorithm(...)}``."""
    return {"replay": dict(layers), "polygraphy_class": "TacticReplayData"}


def timing_cache_record(entries: Dict[str, Tuple[int, float]], version: str) -> Dict[str, Any]:
    """A record of an editable timing cache: ``{key: (tactic hash, time in ms)}``."""
    return {
        "format": TIMING_CACHE_FORMAT,
        "tensorrt": version,
        "entries": {k: {"tactic": hex(int(h)), "timing_ms": float(ms)} for k, (h, ms) in entries.items()},
    }


class RecordError(ConfigError):
    """A file is not a readable tactic record (the message names the file and the problem)."""


def _io(infos: Any, path: Path, layer: str) -> str:
    if not isinstance(infos, list):
        raise RecordError(f"{path}: layer {layer!r}: inputs/outputs must be lists")
    parts = []
    for info in infos:
        if not isinstance(info, dict) or "dtype" not in info:
            raise RecordError(f"{path}: layer {layer!r}: a tensor entry lacks 'dtype'")
        parts.append(f"{info['dtype']}{tuple(info.get('strides') or ())}")
    return ", ".join(parts)


def _algorithm(entry: Any, path: Path, layer: str) -> str:
    if not isinstance(entry, dict) or "tactic" not in entry or "implementation" not in entry:
        raise RecordError(f"{path}: layer {layer!r}: an algorithm needs 'implementation' and 'tactic'")
    return (
        f"(Implementation: {entry['implementation']}, Tactic: {entry['tactic']}) | "
        f"Inputs: [{_io(entry.get('inputs', []), path, layer)}] | "
        f"Outputs: [{_io(entry.get('outputs', []), path, layer)}]"
    )


def load_record(path: str | Path) -> Dict[str, str]:
    """Read one tactic record.

    Args:
        path: a Polygraphy tactic replay (``{"replay": {...}, "polygraphy_class": "TacticReplayData"}``)
            or a timing-cache record (``{"format": TIMING_CACHE_FORMAT, "entries": {...}}``).

    Returns:
        ``{layer or timing-cache key: canonical tactic string}``.

    Raises:
        RecordError: when the file cannot be read, is not JSON, or has neither layout.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise RecordError(f"{path}: cannot be read ({e.strerror})") from None
    except ValueError as e:
        raise RecordError(f"{path}: not JSON ({e})") from None
    if isinstance(data, dict) and data.get("polygraphy_class") == "TacticReplayData":
        replay = data.get("replay")
        if not isinstance(replay, dict):
            raise RecordError(f"{path}: TacticReplayData without a 'replay' mapping")
        return {layer: _algorithm(algo, path, layer) for layer, algo in replay.items()}
    if isinstance(data, dict) and data.get("format") == TIMING_CACHE_FORMAT:
        entries = data.get("entries")
        if not isinstance(entries, dict):
            raise RecordError(f"{path}: timing-cache record without an 'entries' mapping")
        out = {}
        for key, value in entries.items():
            if not isinstance(value, dict) or "tactic" not in value:
                raise RecordError(f"{path}: timing-cache entry {key!r} lacks 'tactic'")
            out[key] = f"tactic {value['tactic']}"
        return out
    raise RecordError(f"{path}: neither a Polygraphy tactic replay nor a timing-cache record")
