"""Candidate models built ahead of their round, within a budget of bytes.

While a round's checks run, the lifecycle builds the models of the rounds that may follow
(``OnnxSearchStrategy.lookahead``); the next round takes those it proposes and the others are dropped.
The models held at once are bounded by their bytes (``ModelProto.ByteSize``), and a model with large
weights builds none ahead where each build holds a copy of its weights (a large model's fp16/bf16 candidates
point into the weight file instead and are built ahead: ``CandidateMaker.weightless``).
"""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, Hashable, Optional, Tuple

import onnx

#: bytes of candidate models built ahead (``ModelProto.ByteSize``) that a run holds at once: the
#: next round's possible candidates, built while a round's checks run; the rest wait for their round
AHEAD_BYTES = 1 << 30
#: models with this many bytes of weights or more build no candidate ahead: each build holds a copy of
#: the weights (on a 222 MB decoder the builds ahead took the peak memory from 2.4x to 18x the model)
AHEAD_LARGE = 64 * 2**20

#: what a model built ahead is held by: the search's variant and the unit set
AheadKey = Tuple[Hashable, FrozenSet[int]]


class AheadModels:
    """The models built ahead for the round to come, by key.

    Attributes:
        weight_bytes: bytes of weights each candidate built ahead holds a copy of (the mode sets it: the searched
            model's, or 0 where its candidates point into the weight file): from ``AHEAD_LARGE`` on, nothing is
            built ahead.
    """

    def __init__(self) -> None:
        self._models: Dict[AheadKey, Tuple[onnx.ModelProto, int]] = {}  # each with its bytes
        self._bytes = 0
        self.weight_bytes = 0

    def __len__(self) -> int:
        """How many models are held."""
        return len(self._models)

    def budget(self) -> int:
        """Bytes of models this search may hold ahead: ``AHEAD_BYTES``, or 0 for a model of ``AHEAD_LARGE``
        bytes of weights or more."""
        return 0 if self.weight_bytes >= AHEAD_LARGE else AHEAD_BYTES

    def build(self, key: AheadKey, build: Callable[[], onnx.ModelProto]) -> bool:
        """Build the model of ``key`` with ``build`` and hold it until ``clear``.

        Returns:
            True when it is held (built now or before); False when it does not fit in the budget with
            the ones held (a model found too large after its build is dropped).

        Raises:
            Whatever ``build`` raises (an invalid candidate: the tool's defect).
        """
        if key in self._models:
            return True
        budget = self.budget()
        if self._bytes >= budget:
            return False
        model = build()
        size = model.ByteSize()
        if self._bytes + size > budget:
            return False
        self._models[key] = (model, size)
        self._bytes += size
        return True

    def take(self, key: AheadKey) -> Optional[onnx.ModelProto]:
        """The model built ahead for ``key``, no longer held; None when none was."""
        held = self._models.pop(key, None)
        if held is None:
            return None
        self._bytes -= held[1]
        return held[0]

    def clear(self) -> None:
        """Drop every model held (the outcomes that did not come)."""
        self._models.clear()
        self._bytes = 0
