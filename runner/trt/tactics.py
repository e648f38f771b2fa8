"""Record which tactics a TensorRT build chose, in a JSON layout diff_tactics can read.

TensorRT 10 and older: an algorithm selector reports each layer's choice; the record uses
Polygraphy's TacticReplayData layout, so Polygraphy's replays and ours mix freely.
TensorRT 11 (algorithm selector removed): the editable timing cache's entries, one per
timing-cache key, with the tactic hash chosen for it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import tensorrt as trt

from runner.files import tactic_records


def _tensor_info(io: Any) -> Dict[str, Any]:
    return tactic_records.tensor_info(
        str(io.dtype),
        list(io.strides),
        getattr(io, "vectorized_dim", None),
        getattr(io, "components_per_element", None),
    )


class TacticRecorder(trt.IAlgorithmSelector):
    """An algorithm selector that keeps every choice TensorRT reports (TensorRT 10 and older)."""

    def __init__(self) -> None:
        trt.IAlgorithmSelector.__init__(self)
        self.replay: Dict[str, Dict[str, Any]] = {}

    def select_algorithms(self, context: trt.IAlgorithmContext, choices: List[trt.IAlgorithm]) -> List[int]:
        """Allow every choice (recording only)."""
        return list(range(len(choices)))

    def report_algorithms(self, contexts: List[trt.IAlgorithmContext], choices: List[trt.IAlgorithm]) -> None:
        """Store the chosen algorithm of each layer."""
        for context, choice in zip(contexts, choices):
            n_in, n_out = context.num_inputs, context.num_outputs
            self.replay[context.name] = tactic_records.algorithm(
                choice.algorithm_variant.implementation,
                choice.algorithm_variant.tactic,
                [_tensor_info(choice.get_algorithm_io_info(i)) for i in range(n_in)],
                [_tensor_info(choice.get_algorithm_io_info(i)) for i in range(n_in, n_in + n_out)],
            )

    def to_replay(self) -> Dict[str, Any]:
        """The record in Polygraphy's TacticReplayData JSON layout."""
        return tactic_records.replay_record(self.replay)


def timing_cache_record(cache: trt.ITimingCache, version: str) -> Dict[str, Any]:
    """Entries of an editable timing cache: ``{key: {"tactic": hex hash, "timing_ms": float}}``."""
    entries: Dict[str, Tuple[int, float]] = {}
    for key in cache.queryKeys():
        value = cache.query(key)
        entries[str(key)] = (int(value.tacticHash), float(value.timingMSec))
    return tactic_records.timing_cache_record(entries, version)
