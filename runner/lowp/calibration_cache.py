"""int8 activation ranges kept across runs (``calibration.cache=FILE``), as TensorRT keeps a calibration cache.

A JSON file: ``{"format": "onnx-debug-runner calibration cache", "version": 1, "identity": {...},
"ranges": {tensor: [lowest, highest], ...}}``. The identity says what the ranges were computed from: the
model (a digest of its graph and weights), the samples used (a digest of their arrays), the calibration
method and its options. A run with ``calibration.cache=FILE`` reads the file when it exists and its
identity is the run's, else calibrates and writes it (a new file, whole or not at all); a file made from
another model, other samples or options is refused in one line rather than used or overwritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.errors import ConfigError, first_line
from runner.lowp.quant_options import QuantOptions

log = logging.getLogger(__name__)

FORMAT, VERSION = "onnx-debug-runner calibration cache", 1


def identity(
    model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]], options: QuantOptions
) -> Dict[str, Any]:
    """What calibrated ranges depend on: the model's graph and weights, the samples, the method and options."""
    graph = hashlib.sha256()
    for node in model.graph.node:
        graph.update(node.SerializeToString())
    for tensor in model.graph.initializer:
        graph.update(tensor.SerializeToString())
    data = hashlib.sha256()
    for feeds in samples:
        for name in sorted(feeds):
            array = np.ascontiguousarray(feeds[name])
            data.update(f"{name}:{array.dtype}:{array.shape}".encode())
            data.update(array.tobytes())
    return {
        "model": graph.hexdigest()[:32],
        "samples": len(samples),
        "samples_digest": data.hexdigest()[:32],
        "method": options.method,
        "percentile": options.percentile if options.method == "percentile" else None,
        "symmetric_activations": options.symmetric_activations,
        "op_types": sorted(options.op_types()),
    }


def load(path: Path, expected: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The ranges ``{tensor: (lowest, highest)}`` of the cache at ``path``; None when there is no file.

    Raises:
        ConfigError: the file is not such a cache, or was made from another model, samples or options.
    """
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"calibration.cache={path} is no calibration cache of this tool ({first_line(e)}); name a new file "
            "for the ranges (they are written there)"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ConfigError(
            f"calibration.cache={path} is no calibration cache of this tool; name a new file for the ranges "
            "(they are written there)"
        )
    found = data.get("identity", {})
    differ = sorted(k for k in expected if found.get(k) != expected[k])
    if differ:
        made = ", ".join(_made_with(k, found.get(k), expected[k]) for k in differ)
        raise ConfigError(
            f"calibration.cache={path} was made with {made}; name a new file to calibrate again (the ranges are "
            "written there), or give the options it was made with"
        )
    return {name: (float(lo), float(hi)) for name, (lo, hi) in data["ranges"].items()}


def _made_with(key: str, found: Any, asked: Any) -> str:
    """One difference between a cache's identity and the run's, the file's value first: ``method=entropy
    (this run: minmax)``; digests are named, not printed."""
    if key in ("model", "samples_digest"):
        return {"model": "another model", "samples_digest": "other samples"}[key]
    return f"{key}={found} (this run: {asked})"


def save(path: Path, made: Dict[str, Any], ranges: Mapping[str, Any]) -> None:
    """Write the cache (``ranges``: ONNX Runtime's ``TensorData`` per tensor) at ``path``, whole or not at all.

    Raises:
        ArtifactError: it cannot be written.
    """
    from runner.jsonio import write_json_atomic

    values = {name: [_scalar(d.range_value[0]), _scalar(d.range_value[1])] for name, d in ranges.items()}
    write_json_atomic(path, {"format": FORMAT, "version": VERSION, "identity": made, "ranges": values})
    log.info("Wrote the calibration cache %s (%d tensors)", path, len(values))


def _scalar(value: Any) -> float:
    """A range bound as a float (ONNX Runtime gives 0-d or 1-element arrays)."""
    return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
