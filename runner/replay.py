"""Debug replay: per iteration, the candidate's key and its verdict, saved after every iteration.

Loading a replay (``replay.load=PATH``) makes the lifecycle reuse recorded verdicts instead of
running the check, so a stopped run resumes where it was and ends with the same result.
The same table serves as the in-run cache: a candidate is never checked twice.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

from runner.errors import ConfigError
from runner.jsonio import write_json_atomic
from strategies.base import Candidate, Verdict

log = logging.getLogger(__name__)

FORMAT = "runner-replay/1"


class Replay:
    """The replay file of one run, and the verdicts known so far (loaded or recorded).

    Args:
        save_path: where the replay JSON is rewritten (atomically) after each iteration.
        mode: the mode's name; a loaded replay must come from the same mode.
        load_path: an earlier run's replay to reuse verdicts from, or None.

    Raises:
        ConfigError: when ``load_path`` is missing, not a replay file, or from another mode.
    """

    def __init__(self, save_path: Path, mode: str, load_path: Optional[Path] = None):
        self.save_path = Path(save_path)
        self.mode = mode
        self.entries: List[Dict[str, Any]] = []
        self._known: Dict[str, Verdict] = {}
        if load_path is not None:
            for entry in self._read(Path(load_path), mode):
                self._known.setdefault(entry["key"], _verdict(entry))
            log.info("Loaded %d recorded verdicts from %s", len(self._known), load_path)

    @staticmethod
    def _read(path: Path, mode: str) -> List[Dict[str, Any]]:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"replay.load={path}: no such file; give the replay.json of an earlier run") from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"replay.load={path}: not a readable replay file ({e}); give the replay.json of an earlier run") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("iterations"), list):
            raise ConfigError(f"replay.load={path}: not a replay file (expected format {FORMAT!r}); give the replay.json of an earlier run")
        if data.get("mode") != mode:
            raise ConfigError(f"replay.load={path}: recorded by mode={data.get('mode')}, not mode={mode}; resume with the same mode")
        for i, entry in enumerate(data["iterations"]):
            if not isinstance(entry, dict) or "key" not in entry or "passed" not in entry:
                raise ConfigError(f"replay.load={path}: iteration entry {i} lacks 'key' or 'passed'; the file is damaged")
        return data["iterations"]

    def lookup(self, key: str) -> Optional[Verdict]:
        """Return the known verdict for a candidate key, or None when it was never checked."""
        return self._known.get(key)

    def record(self, iteration: int, candidate: Candidate, verdict: Verdict, reused: bool) -> None:
        """Append one iteration and rewrite the replay file atomically.

        Raises:
            OSError: when the replay file cannot be written.
        """
        self._known.setdefault(candidate.key, verdict)
        self.entries.append(
            {
                "iteration": iteration,
                "key": candidate.key,
                "label": candidate.label,
                "passed": verdict.passed,
                "returncode": verdict.returncode,
                "reason": verdict.reason,
                "details": verdict.details,
                "reused": reused,
            }
        )
        write_json_atomic(self.save_path, {"format": FORMAT, "mode": self.mode, "iterations": self.entries})


def _verdict(entry: Dict[str, Any]) -> Verdict:
    return Verdict(
        passed=bool(entry["passed"]),
        returncode=entry.get("returncode"),
        reason=entry.get("reason", ""),
        details=entry.get("details") or {},
    )
