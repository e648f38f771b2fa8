"""Verdicts that contradict each other under a monotone check, found among a replay's entries.

The searches of reduce and precision rely on a monotone check: a candidate that holds the failure
(reduce) or passes (precision) keeps doing so when nodes are added. A loaded replay whose verdicts
break that (a set gave the target and a superset of it did not) was edited or recorded by a check
that is not deterministic; a search that trusts it wanders for hundreds of checks before the
answer fails as written. Here each verdict with its unit set (``Candidate.units``) is kept as a
bitmask, and a verdict that contradicts a loaded one is named at once, with both entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple


@dataclass(frozen=True)
class Entry:
    """One verdict on a unit set.

    Attributes:
        mask: the unit set as a bitmask (bit i: unit i).
        size: how many units.
        hit: whether the candidate gave the search's target.
        iteration: the iteration that recorded it.
        label: the candidate's label.
        loaded: it comes from a loaded replay (else this run checked it).
    """

    mask: int
    size: int
    hit: bool
    iteration: int
    label: str
    loaded: bool


def mask_of(units: Iterable[int]) -> int:
    """A unit set as a bitmask."""
    mask = 0
    for u in units:
        mask |= 1 << int(u)
    return mask


def _family(key: str) -> str:
    """The part of a candidate key that makes unit sets comparable: the model's fingerprint and the
    variant (``fingerprint:variant:digest``)."""
    return key.rsplit(":", 1)[0]


class Ledger:
    """The verdicts on unit sets seen in a run, by family, checked for monotonicity.

    Args:
        hit_on_pass: True when the target is a passing candidate (precision), False when it is a
            failing one (reduce).
    """

    def __init__(self, hit_on_pass: bool):
        self.hit_on_pass = hit_on_pass
        self._entries: Dict[str, List[Entry]] = {}

    def add(
        self, key: str, units: Iterable[int], passed: bool, iteration: int, label: str, loaded: bool
    ) -> Optional[str]:
        """Record a verdict; the contradiction it makes with a loaded verdict (one line), or None.

        A contradiction is a hit on a set S and a miss on a superset of S. Two verdicts of this run
        that contradict each other are the check's own non-monotonicity (the searches allow it) and
        are not reported; one of them loaded is.
        """
        units = list(units)
        entry = Entry(mask_of(units), len(units), passed == self.hit_on_pass, iteration, label, loaded)
        family = self._entries.setdefault(_family(key), [])
        found = None
        for other in family:
            if not (entry.loaded or other.loaded):
                continue
            pair = _contradiction(entry, other)
            if pair is not None:
                found = pair
                break
        family.append(entry)
        return None if found is None else self._describe(*found)

    def first_contradiction(self) -> Optional[str]:
        """The first contradiction among the entries recorded so far (loaded ones), or None."""
        for family in self._entries.values():
            hits = sorted((e for e in family if e.hit), key=lambda e: e.size)
            misses = sorted((e for e in family if not e.hit), key=lambda e: -e.size)
            for hit in hits:
                for miss in misses:
                    if miss.size < hit.size:
                        break
                    if hit.mask & ~miss.mask == 0 and (hit.loaded or miss.loaded):
                        return self._describe(hit, miss)
        return None

    def _describe(self, hit: Entry, miss: Entry) -> str:
        target = "passed" if self.hit_on_pass else "failed"
        other = "failed" if self.hit_on_pass else "passed"
        if hit.mask == miss.mask:
            same = f"iteration {miss.iteration}, the same candidate"
            return f"iteration {hit.iteration} ({hit.label}) {target} but {same}, {other}"
        return (
            f"iteration {hit.iteration} ({hit.label}) {target} but iteration {miss.iteration} ({miss.label}), which "
            f"holds every unit it holds and {miss.size - hit.size} more, {other}"
        )


def _contradiction(a: Entry, b: Entry) -> Optional[Tuple[Entry, Entry]]:
    """(hit, miss) when one of ``a``, ``b`` is a hit on a subset of the other's miss."""
    for hit, miss in ((a, b), (b, a)):
        if hit.hit and not miss.hit and hit.size <= miss.size and hit.mask & ~miss.mask == 0:
            return hit, miss
    return None
