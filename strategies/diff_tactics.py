"""``mode=diff_tactics``: name the tactics that appear only in bad builds' records.

Reads every tactic record under ``dir/good`` and ``dir/bad`` (or the ``good=``/``bad=`` lists of
files or directories): Polygraphy's TacticReplayData JSON and this project's timing-cache
records alike (``runner.files.tactic_records``). For each layer, a tactic seen in some bad record and
in no good record is potentially bad; it is reported with how many bad records chose it.
Needs no TensorRT and runs no check.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from runner.context import RunContext
from runner.errors import ConfigError, NothingToDoError
from runner.files.tactic_records import RecordError, load_record
from strategies.base import Report
from strategies.mode_keys import DiffTacticsKeys

log = logging.getLogger(__name__)


KEYS = DiffTacticsKeys

Records = List[Tuple[Path, Dict[str, str]]]


def collect(sources: Sequence[str], side: str, implied: bool = False) -> Records:
    """Load the records named by ``sources`` (files, or directories searched recursively for *.json).

    A file named explicitly must be a record (RecordError otherwise); a non-record found while
    searching a directory is skipped with a warning naming it and the problem.

    Args:
        sources: files or directories. side: "good" or "bad", for messages.
        implied: the sources are ``dir=``'s ``good/`` and ``bad/``: one that does not exist holds no
            records (``mode=build`` makes ``bad/`` only once a build is bad).

    Raises:
        ConfigError: a source named explicitly does not exist. RecordError: an explicit file is not a record.
    """
    records: Records = []
    for source in sources:
        path = Path(source)
        if implied and not path.exists():
            continue
        if path.is_file():
            records.append((path, load_record(path)))
        elif path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                try:
                    records.append((file, load_record(file)))
                except RecordError as e:
                    log.warning("Skipping %s", e)
        else:
            raise ConfigError(
                f"{side} record source {path} does not exist; give a file or a directory of tactic records"
            )
    return records


def potentially_bad(good: Records, bad: Records) -> Dict[str, List[Dict[str, Any]]]:
    """Per layer, the tactics seen in bad records and never in good ones, most frequent first.

    Returns:
        ``{layer: [{"tactic": str, "bad_records": count}, ...]}``, layers ordered by their
        most frequent suspicious tactic.
    """
    seen_good: Dict[str, Set[Any]] = defaultdict(set)
    for _, rec in good:
        for layer, tactic in rec.items():
            seen_good[layer].add(tactic)
    counts: Dict[str, Counter[Any]] = defaultdict(Counter)
    for _, rec in bad:
        for layer, tactic in rec.items():
            if tactic not in seen_good[layer]:
                counts[layer][tactic] += 1
    report = {layer: [{"tactic": t, "bad_records": n} for t, n in c.most_common()] for layer, c in counts.items()}
    return dict(sorted(report.items(), key=lambda kv: -kv[1][0]["bad_records"]))


class DiffTacticsStrategy(Report):
    """A report, not a search: no candidates, no checks.

    Args:
        good: sources of good records. bad: sources of bad records.

    Raises:
        ConfigError: neither ``dir`` nor both ``good`` and ``bad`` given.
    """

    def __init__(self, good: Sequence[str], bad: Sequence[str], implied: Sequence[str] = ()):
        self.good_sources, self.bad_sources = list(good), list(bad)
        self.implied = set(implied)  # the sides that come from dir= (good/, bad/)
        self.report: Optional[Dict[str, Any]] = None

    @classmethod
    def create(
        cls,
        ctx: RunContext,
        keys: DiffTacticsKeys,
        *,
        checker: Any = None,
        marker: Any = None,
    ) -> DiffTacticsStrategy:
        """Sources from ``good=``/``bad=`` lists, else ``dir=D`` meaning ``D/good`` and ``D/bad`` (``DiffTacticsKeys``).

        Raises:
            ConfigError: neither ``dir`` nor both ``good`` and ``bad`` given.
        """
        dir, good, bad = keys.dir, list(keys.good or []), list(keys.bad or [])
        implied = []
        if dir:
            if not Path(dir).is_dir():
                raise ConfigError(
                    f"dir={dir} is not a directory; give the directory mode=build sorted into good/ and bad/"
                )
            implied = [side for side, given in (("good", good), ("bad", bad)) if not given]
            good = good or [str(Path(dir) / "good")]
            bad = bad or [str(Path(dir) / "bad")]
        if not good or not bad:
            raise ConfigError(
                "mode=diff_tactics needs dir=DIR (with good/ and bad/ inside) or both good=[...] and bad=[...]"
            )
        return cls(good, bad, implied)

    def finish(self) -> None:
        """Load both sides and compute the report.

        Raises:
            NothingToDoError: neither side has a record. With no bad record the report is empty (logged, as
                Polygraphy does); with no good record every tactic of the bad records is potentially bad.
        """
        good = collect(self.good_sources, "good", "good" in self.implied)
        bad = collect(self.bad_sources, "bad", "bad" in self.implied)
        if not good and not bad:
            raise NothingToDoError(
                f"no tactic records in {', '.join(self.good_sources + self.bad_sources)}; run mode=build first "
                "(it sorts each build's tactic record into good/ or bad/)"
            )
        if not bad:  # as Polygraphy: nothing to blame is no error
            log.info(
                "Could not determine potentially bad tactics: no bad tactic records in %s (every build so far was "
                "good); run mode=build until a bad build is sorted",
                ", ".join(self.bad_sources),
            )
        elif not good:
            log.warning(
                "No good tactic records in %s: every tactic of the bad builds is potentially bad",
                ", ".join(self.good_sources),
            )
        layer_sets = {frozenset(rec) for _, rec in good + bad}
        mismatched = sorted(set().union(*layer_sets) - frozenset.intersection(*layer_sets)) if layer_sets else []
        if mismatched:
            log.warning(
                "Layers differ across records (%d appear in only some, e.g. %s): were they built from different "
                "models or TensorRT versions?",
                len(mismatched),
                ", ".join(mismatched[:3]),
            )
        report = potentially_bad(good, bad) if bad else {}
        if report:
            for layer, tactics in report.items():
                for t in tactics:
                    log.info(
                        "Potentially bad: layer %s: %s (in %d of %d bad records, no good one)",
                        layer,
                        t["tactic"],
                        t["bad_records"],
                        len(bad),
                    )
        elif bad:
            log.info(
                "Could not determine potentially bad tactics: every tactic in a bad record also appears in a good one. "
                "Try more records."
            )
        self.report = {
            "good_records": len(good),
            "bad_records": len(bad),
            "potentially_bad": report,
            "mismatched_layers": mismatched,
        }

    def result(self) -> Dict[str, Any]:
        """``good_records``, ``bad_records``, ``potentially_bad`` (per layer), ``mismatched_layers``."""
        return dict(self.report or {})
