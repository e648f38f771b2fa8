"""A search built when it is first used, for searches whose order costs work that a run may never need
(precision's int8 ranking: a layerwise pass, skipped when the fully quantized model passes)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from strategies.onnx_search import Search


class DeferredSearch:
    """A search built when first used: int8's ranking costs a layerwise pass (seconds to minutes), and
    a model that passes fully quantized (the gate checked first) never needs it.

    Args:
        build: makes the search.
        stand_in: a search of the same size, whose ``remaining()`` estimates the real one's until
            it is built (progress display only).
    """

    def __init__(self, build: Callable[[], Search], stand_in: Search):
        self._build, self._stand_in = build, stand_in
        self._search: Optional[Search] = None

    def remaining(self) -> int:
        """The built search's estimate, else the stand-in's."""
        return (self._search or self._stand_in).remaining()

    @property
    def rounds(self) -> int:
        """Rounds the search has stepped: the stand-in's (none) until it is built (the gates step none)."""
        return (self._search or self._stand_in).rounds

    @property
    def required(self) -> Any:
        """The units found necessary so far: the stand-in's (none) until the search is built."""
        return (self._search or self._stand_in).required

    def __getattr__(self, name: str) -> Any:
        if self._search is None:
            self._search = self._build()
        return getattr(self._search, name)
