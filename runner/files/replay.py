"""Debug replay: per iteration, the candidate's key and its verdict, saved after every iteration.

Loading a replay (``replay.load=PATH``) makes the lifecycle reuse recorded verdicts instead of
running the check, so a stopped run resumes where it was and ends with the same result.
The same table serves as the in-run cache: a candidate is never checked twice.

A replay records its run's identity (``runner.files.identity``: the model's content, the mode, the
check, the inputs); loading a replay of another identity is an error naming what differs, unless
``replay.force=true``. Entries of the wrong type are errors, never coerced.

Crash safety (as Polygraphy's ``_skip_current`` replay entry): before a check starts, its candidate
is recorded as *pending*, with the run's fatal-signal log (``runner.terminal.signals.fatal_log``: Python's
``faulthandler`` writes there when the process dies of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL);
its verdict clears it. A check that kills the runner (a segfault in an in-process check, an abort)
leaves it pending with a non-empty fatal log, and a run resumed from that replay counts the one
pending candidate as a **crash**: a failing verdict of its own kind (``Verdict.crash``, counted
as ``crashes`` in ``summary.json``), so the search moves on instead of crashing again. A runner
killed from outside (``kill -9``, the OOM killer, a power cut) writes no fatal log: its pending
candidate is checked again, as ``replay.retry_pending=true`` asks for any. Several pending
candidates (a parallel round) cannot tell which one crashed: they are checked again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from runner.candidates import Candidate, Verdict
from runner.errors import ArtifactError, CheckError, ConfigError, first_line
from runner.files.identity import differences
from runner.files.monotone import Ledger
from runner.jsonio import write_json_atomic

log = logging.getLogger(__name__)

FORMAT = "runner-replay/2"
#: the format before identities were recorded (loaded only with replay.force=true)
OLD_FORMATS = ("runner-replay/1",)


class Replay:
    """The replay file of one run, and the verdicts known so far (loaded or recorded).

    Args:
        save_path: where the replay JSON is rewritten (atomically) after each iteration.
        mode: the mode's name; a loaded replay must come from the same mode.
        load_path: an earlier run's replay to reuse verdicts from, or None.
        identity: what this run's verdicts depend on (``runner.files.identity.run_identity``).
        force: reuse a loaded replay's verdicts even when its identity differs.
        retry_pending: check a loaded replay's pending candidate again instead of counting it as
            a crash.
        fatal_log: where this run's fatal signals are logged, recorded with each pending candidate.

    Raises:
        ConfigError: when ``load_path`` is missing, not a replay file, from another mode, of
            another identity (without ``force``), or holds an entry of the wrong type.
    """

    def __init__(
        self,
        save_path: Path,
        mode: str,
        load_path: Optional[Path] = None,
        identity: Optional[Dict[str, Any]] = None,
        force: bool = False,
        retry_pending: bool = False,
        fatal_log: Optional[Path] = None,
    ):
        self.save_path = Path(save_path)
        self.mode = mode
        self.identity = identity or {}
        self.entries: List[Dict[str, Any]] = []
        self._known: Dict[str, Verdict] = {}
        self._loaded_keys: Set[str] = set()
        #: keys whose loaded verdict was recorded with another identity (reused only with force)
        self.foreign: Set[str] = set()
        #: candidates whose check has started and not ended, by key
        self.pending: Dict[str, Dict[str, Any]] = {}
        self.fatal_log = fatal_log
        self.force = force
        #: the loaded replay's entries, in its order
        self.loaded: List[Dict[str, Any]] = []
        #: checks every verdict against the loaded ones (``watch``); None: not watched
        self.ledger: Optional[Ledger] = None
        #: the loaded replay is as a run of this identity wrote it (``seal``): its verdicts need no recheck
        self.sealed = False
        if load_path is not None:
            entries, changed, pending, recorded = self._read(Path(load_path), mode, self.identity, force)
            self.sealed = not changed and recorded == seal(self.identity, entries)
            self.loaded = list(entries)
            self._loaded_keys = {entry["key"] for entry in entries}
            for entry in entries:
                self._known.setdefault(entry["key"], _verdict(entry))
            self._crashed(pending, retry_pending, Path(load_path))
            log.info("Loaded %d recorded verdicts from %s", len(self._known), load_path)
            if changed:
                self.foreign = set(self._known)
                log.warning(
                    "replay.force=true: the %d verdicts of %s were recorded with another %s; each one reused is "
                    "counted in summary.json (reused_from_other_identity), and the answer is checked again",
                    len(self._known),
                    load_path,
                    ", ".join(changed),
                )

    def _crashed(self, pending: List[Dict[str, Any]], retry: bool, path: Path) -> None:
        """Count a loaded replay's one pending candidate as a crash (see the module docstring)."""
        open_ = [p for p in pending if p["key"] not in self._known]
        if not open_:
            return
        entry = open_[0]
        fatal = entry.get("fatal_log")
        died = isinstance(fatal, str) and Path(fatal).is_file() and Path(fatal).stat().st_size > 0
        if retry or len(open_) > 1 or not died:
            why = (
                "replay.retry_pending=true"
                if retry
                else "several were running: which one crashed is unknown"
                if len(open_) > 1
                else "the runner was killed from outside: no fatal signal was logged"
            )
            log.warning("%d check(s) of %s never ended; they are checked again (%s)", len(open_), path, why)
            return
        self._known[entry["key"]] = Verdict(
            passed=False,
            reason="crashed the runner when it was checked before (pending in the replay)",
            crash=True,
            crashed_iteration=entry.get("iteration"),
        )
        log.warning(
            "Iteration %s (%s) of %s never ended: the check crashed the runner; it counts as a failure of its own "
            "kind (a crash) and is not checked again (replay.retry_pending=true checks it again)",
            entry.get("iteration"),
            entry.get("label", ""),
            path,
        )

    def begin(self, iteration: int, candidate: Candidate) -> None:
        """Record a candidate as pending before its check starts (one file write per round: ``flush``)."""
        self.pending[candidate.key] = {
            "iteration": iteration,
            "key": candidate.key,
            "label": candidate.label,
            "fatal_log": str(self.fatal_log) if self.fatal_log is not None else None,
        }

    def end(self, keys: List[str]) -> None:
        """Clear pending candidates whose checks will not end (the run stops cleanly) and rewrite the file."""
        for key in keys:
            self.pending.pop(key, None)
        self.flush()

    def flush(self) -> None:
        """Rewrite the replay file with the verdicts and the pending candidates.

        Raises:
            ArtifactError: when the replay file cannot be written.
        """
        try:
            write_json_atomic(
                self.save_path,
                {
                    "format": FORMAT,
                    "mode": self.mode,
                    "identity": self.identity,
                    "iterations": self.entries,
                    "pending": list(self.pending.values()),
                    "seal": seal(self.identity, self.entries),
                },
            )
        except OSError as e:
            raise ArtifactError(
                f"cannot rewrite the replay {self.save_path} ({e.strerror}); it still holds every verdict before "
                f"this one: free some space and resume with replay.load={self.save_path}"
            ) from None

    @staticmethod
    def _read(
        path: Path, mode: str, identity: Dict[str, Any], force: bool
    ) -> Tuple[List[Dict[str, Any]], List[str], List[Dict[str, Any]], Optional[str]]:
        """The replay's entries, what of its identity differs from ``identity`` (only with ``force``),
        its pending candidates, and its seal (None in a file written before seals)."""
        hint = "give the replay.json of an earlier run"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"replay.load={path}: no such file; {hint}") from None
        except RecursionError:
            raise ConfigError(f"replay.load={path}: nested too deeply to be a replay file; {hint}") from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"replay.load={path}: not a readable replay file ({first_line(e)}); {hint}") from None
        formats = (FORMAT, *OLD_FORMATS)
        if (
            not isinstance(data, dict)
            or data.get("format") not in formats
            or not isinstance(data.get("iterations"), list)
        ):
            raise ConfigError(f"replay.load={path}: not a replay file (expected format {FORMAT!r}); {hint}")
        if data.get("mode") != mode:
            raise ConfigError(
                f"replay.load={path}: recorded by mode={data.get('mode')}, not mode={mode}; resume with the same mode"
            )
        recorded = data.get("identity")
        changed = differences(recorded, identity) if isinstance(recorded, dict) else ["identity (not recorded)"]
        if not force:
            if not isinstance(recorded, dict):
                raise ConfigError(
                    f"replay.load={path} does not record what its verdicts depend on (an older format); "
                    "replay.force=true reuses it anyway"
                )
            if changed:
                raise ConfigError(
                    f"replay.load={path} was recorded with another {', '.join(changed)}; its verdicts may not "
                    "hold for this run: resume with the same settings, or replay.force=true to reuse them anyway"
                )
        for i, entry in enumerate(data["iterations"]):
            problem = _entry_problem(entry)
            if problem:
                raise ConfigError(f"replay.load={path}: iteration entry {i} {problem}; the file is damaged")
        pending = data.get("pending") or []
        if not isinstance(pending, list) or not all(
            isinstance(p, dict) and isinstance(p.get("key"), str) for p in pending
        ):
            raise ConfigError(f"replay.load={path}: its pending list holds entries without keys; the file is damaged")
        return data["iterations"], changed, pending, data.get("seal")

    def watch(self, hit_on_pass: bool) -> None:
        """Check verdicts for monotonicity from now on (``runner.files.monotone``): the loaded ones against each
        other now, and each one recorded against the loaded ones.

        Args:
            hit_on_pass: True when the search's target is a passing candidate (precision).

        Raises:
            ConfigError: two loaded verdicts contradict each other (without ``replay.force``).
        """
        self.ledger = Ledger(hit_on_pass)
        for entry in self.loaded:
            units = entry.get("units")
            if isinstance(units, list):
                self.ledger.add(
                    entry["key"],
                    expand_units(units),
                    entry["passed"],
                    entry.get("iteration", 0),
                    entry.get("label", ""),
                    True,
                )
        problem = self.ledger.first_contradiction()
        if problem is not None and not self.force:
            raise ConfigError(
                f"the loaded replay contradicts itself: {problem}; with a monotone check that cannot be: it was "
                "edited, or the check is not deterministic: drop replay.load, or set replay.force=true to use it anyway"
            )

    def lookup(self, key: str) -> Optional[Verdict]:
        """Return the known verdict for a candidate key, or None when it was never checked. It is
        ``sealed`` (no second check before an answer rests on it) where this run checked it, or where it
        comes from a loaded replay whose seal holds; a verdict of an edited or unsealed replay is not."""
        known = self._known.get(key)
        if known is not None and (key not in self._loaded_keys or self.sealed):
            return dataclasses.replace(known, sealed=True)
        return known

    def record(self, iteration: int, candidate: Candidate, verdict: Verdict, reused: bool) -> None:
        """Append one iteration and rewrite the replay file atomically.

        Raises:
            ArtifactError: when the replay file cannot be written (the file on disk keeps the
                verdicts before this one: it is replaced whole or not at all).
        """
        self._known.setdefault(candidate.key, verdict)
        self.pending.pop(candidate.key, None)
        self.entries.append(
            {
                "iteration": iteration,
                "key": candidate.key,
                "label": candidate.label,
                "passed": verdict.passed,
                "returncode": verdict.returncode,
                "reason": verdict.reason,
                "details": verdict.recorded_details(),
                "reused": reused,
                "error": verdict.error,
                **({"units": compact_units(candidate.units)} if candidate.units is not None else {}),
            }
        )
        self.flush()
        if self.ledger is not None and candidate.units is not None and not reused and not self.force:
            problem = self.ledger.add(candidate.key, candidate.units, verdict.passed, iteration, candidate.label, False)
            if problem is not None:
                raise CheckError(
                    f"this run's check contradicts the loaded replay: {problem}; with a monotone check that cannot "
                    "be: the replay was edited or the check is not deterministic: drop replay.load and run again"
                )


def compact_units(units: Iterable[int]) -> List[Any]:
    """A unit set as ``replay.json`` holds it: sorted, each run of consecutive units as ``[first, last]``
    and a lone unit as itself, e.g. ``{0, 2, 3, 4, 9}`` -> ``[0, [2, 4], 9]``. A candidate of a 100,000-node
    chain is a few runs: written as every index, each flush of the replay re-encoded millions of
    numbers (0.4 s a write, two writes a check).

    Args:
        units: node (or unit) indices, in any order.

    Returns:
        The compact list, JSON-able; ``expand_units`` gives the indices back.
    """
    out: List[Any] = []
    for u in sorted(set(units)):
        last = out[-1] if out else None
        if isinstance(last, list) and last[1] == u - 1:
            last[1] = u
        elif isinstance(last, int) and last == u - 1:
            out[-1] = [last, u]
        else:
            out.append(u)
    return out


def expand_units(units: List[Any]) -> List[int]:
    """The indices of a ``compact_units`` list (a plain list of indices, as older replays hold, is itself).

    Raises:
        ValueError: an element that is neither an index nor a ``[first, last]`` pair.
    """
    out: List[int] = []
    for u in units:
        if isinstance(u, list) and len(u) == 2:
            out.extend(range(int(u[0]), int(u[1]) + 1))
        elif isinstance(u, int) and not isinstance(u, bool):
            out.append(u)
        else:
            raise ValueError(f"not a unit or a [first, last] run: {u!r}")
    return out


#: field -> (accepted types, description); missing optional fields are allowed
_FIELDS = {
    "key": ((str,), "a string"),
    "passed": ((bool,), "true or false"),
    "returncode": ((int, type(None)), "an integer or null"),
    "reason": ((str,), "a string"),
    "details": ((dict, type(None)), "an object"),
    "error": ((str,), "a string"),
}


def _entry_problem(entry: Any) -> str:
    """Why a replay entry is malformed, or "" when it is well formed."""
    if not isinstance(entry, dict):
        return "is not an object"
    for name in ("key", "passed"):
        if name not in entry:
            return f"lacks {name!r}"
    for name, (types, words) in _FIELDS.items():
        if name not in entry:
            continue
        value = entry[name]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool) and name == "returncode"):
            return f"has {name}={json.dumps(value)[:40]}, which is not {words}"
    if "units" in entry:
        try:
            expand_units(entry["units"] if isinstance(entry["units"], list) else [entry["units"]])
        except (ValueError, TypeError):
            return f"has units={json.dumps(entry['units'])[:40]}, which is not a list of units and [first, last] runs"
    return ""


def _verdict(entry: Dict[str, Any]) -> Verdict:
    return Verdict.from_record(
        entry.get("details") or {},
        passed=entry["passed"],
        returncode=entry.get("returncode"),
        reason=entry.get("reason", ""),
        error=entry.get("error", ""),
    )


def seal(identity: Dict[str, Any], entries: List[Dict[str, Any]]) -> str:
    """A digest of a replay's identity and verdicts as the runner wrote them: an edit of either breaks it
    (not a signature: it tells an unedited file, it does not stop a forger)."""
    text = json.dumps({"identity": identity, "iterations": entries}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
