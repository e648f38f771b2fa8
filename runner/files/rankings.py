"""Precision's rankings kept in the run directory (``ranking.json``), read again by a resume or another run.

Ranking a model by the error each node introduces, and again by the error each makes at the outputs, costs a
run of the whole model per chunk and one run per node: 131 s for a 0.5B decoder, paid again on every resume
before. What a ranking depends on is its key: the model's content, the inputs, the options that shape the
candidates (precision, scope, calibration, quantization, a given quantized model: the replay identity's
``model``, ``data`` and ``candidates``), the backend that ranked (its name, providers and options), the nodes
ranked and the low-precision target they were compared with. The tolerance, the marker and the budget are no
part of it, so a second run at another tolerance or with another marker reads the ranking too.

A run writes every ranking it makes to ``ranking.json`` in its own directory (``{"format", "version",
"rankings": [{"kind", "key", "order"}]}``, names in order) and reads the rankings of the files it is given:
the ``ranking.json`` beside a loaded replay (a resume), and ``rankings=FILE`` (any earlier run's). A ranking of
another key is passed over; an unreadable file is said in one line and passed over: a cache, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

log = logging.getLogger(__name__)

FORMAT, VERSION = "onnx-debug-runner rankings", 1
#: the file name in a run directory
FILE = "ranking.json"


def key_of(identity: Mapping[str, Any], **parts: Any) -> str:
    """The key of a ranking: a digest over the run identity's ``model``, ``data`` and ``candidates`` and the
    ranking's own ``parts`` (backend, nodes, target, ...), as JSON with sorted keys."""
    chosen = {k: identity.get(k) for k in ("model", "data", "candidates")}
    text = json.dumps({"identity": chosen, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def names_digest(names: Sequence[str]) -> str:
    """A short digest of node names in order (a ranking's nodes)."""
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


class Rankings:
    """The rankings one run reads and writes.

    Args:
        write_to: this run's ``ranking.json`` (None: write nothing).
        read_from: earlier runs' files (missing ones are passed over).
    """

    def __init__(self, write_to: Optional[Path], read_from: Sequence[Path] = ()):
        self.write_to = write_to
        self._lock = threading.Lock()
        self._known: Dict[str, List[str]] = {}
        self._mine: List[Dict[str, Any]] = []
        for path in read_from:
            for entry in _entries(path):
                self._known.setdefault(f"{entry['kind']}:{entry['key']}", list(entry["order"]))

    def get(self, kind: str, key: str) -> Optional[List[str]]:
        """The order of node names an earlier run stored for ``kind`` and ``key``, or None."""
        found = self._known.get(f"{kind}:{key}")
        if found is not None:
            what = "The %s ranking is read from an earlier run's %s (%d items): not ranked again"
            log.info(what, kind, FILE, len(found))
        return found

    def put(self, kind: str, key: str, order: Sequence[str]) -> None:
        """Keep a ranking made now and rewrite this run's file (whole or not at all)."""
        from runner.jsonio import write_json_atomic

        with self._lock:
            self._known[f"{kind}:{key}"] = list(order)
            self._mine = [e for e in self._mine if not (e["kind"] == kind and e["key"] == key)]
            self._mine.append({"kind": kind, "key": key, "order": list(order)})
            if self.write_to is None:
                return
            try:
                write_json_atomic(self.write_to, {"format": FORMAT, "version": VERSION, "rankings": self._mine})
            except OSError as e:  # a cache must not cost the run
                log.warning("Could not write %s (%s); the ranking is not kept", self.write_to, e.strerror)


def _entries(path: Path) -> List[Dict[str, Any]]:
    """The rankings in a ``ranking.json`` (a run directory names its file); none for a missing file, and a
    log line for one that is no rankings file."""
    if path.is_dir():
        path = path / FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning("%s is no rankings file (%s); ranking anew", path, e)
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("rankings"), list):
        log.warning("%s is no rankings file of this tool; ranking anew", path)
        return []
    return [e for e in data["rankings"] if isinstance(e, dict) and {"kind", "key", "order"} <= set(e)]
