"""Prefix search: the shortest prefix of an order that gives the target verdict.

Pure: no I/O, no ONNX, no logging. Polygraphy's precision algorithm (``debug precision``):
the marker searches 1..n for the shortest prefix ``order[:i]`` that gives the target, knowing
the whole order does and assuming the empty prefix does not. Same interface as
``strategies.set_search.SetSearch`` (``next``, ``step``, ``result``, ``remaining``, ``rounds``,
``label``), so a mode holds either one without branching on which.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Generic, Hashable, List, Optional, Sequence, TypeVar

from strategies.boundary import BoundaryMarker

T = TypeVar("T", bound=Hashable)


class PrefixSearch(Generic[T]):
    """Drives one boundary marker over the prefixes of ``order``.

    Args:
        order: the elements; candidates are ``order[:i]``.
        marker_factory: ``marker_factory(count)`` returns a fresh boundary marker.

    Raises:
        ValueError: when ``order`` is empty.

    Usage: ``while (s := search.next()) is not None: search.step(target(s))``; then ``result``.
    """

    def __init__(self, order: Sequence[T], marker_factory: Callable[[int], BoundaryMarker]):
        self.order: List[T] = list(order)
        self.marker = marker_factory(len(self.order))
        self.rounds = 0
        self.done = False
        self.required: List[T] = []  # a prefix search names no single needed element
        self._pending: Optional[int] = None

    def next(self) -> Optional[FrozenSet[T]]:
        """The next prefix to test, or None when the search is over."""
        index = None if self.done else self.marker.next()
        if index is None:
            self.done = True
            self.rounds = 1
            return None
        self._pending = index
        return frozenset(self.order[:index])

    def step(self, hit: bool) -> None:
        """Feed the verdict for the prefix last returned by ``next()``: True when it gave the target."""
        assert self._pending is not None
        self.marker.step(self._pending, hit)

    @property
    def result(self) -> FrozenSet[T]:
        """The shortest prefix known to give the target (the whole order until one shorter did)."""
        return frozenset(self.order[: self.marker.boundary])

    def remaining(self) -> int:
        """Tests left, as the marker estimates."""
        return 0 if self.done else self.marker.remaining()

    def label(self, noun: str = "element") -> str:
        """What the next candidate is, for the log."""
        return f"prefix of {self._pending} of {len(self.order)} {noun}s"
