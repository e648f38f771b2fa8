"""The second ranking of a precision search: the searchable units ordered by the error each makes at the outputs
alone in the low precision (``runner.layerwise.output_ranking``), for a set search that finds the needed nodes many
(``strategies.precision.group_search.REORDER_FROM``); and what of the checker keys a stored ranking (``backend_key``).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

import onnx

from runner.backends.base import Backend, make_backend
from runner.backends.onnxruntime import OnnxRuntimeBackend
from runner.checkers.base import Checker
from runner.context import RunContext
from runner.files.rankings import key_of, names_digest
from runner.graph.load import fingerprint
from runner.layerwise.output_ranking import Made, RankingAbandoned, output_error_ranking
from runner.layerwise.ranking import ranking_backend
from runner.lowp.makers import CandidateMaker
from runner.lowp.switchboard import LazySwitchboard, RunsOn, Switchboard
from strategies.budget import Budget
from strategies.precision.group_search import REORDER_FROM

log = logging.getLogger(__name__)


class OutputErrorOrder:
    """The second ranking, for a set search that finds the needed nodes many (``strategies.precision.group_search``'s
    ``reorder``): the items ordered by the error each makes at the outputs alone in the low precision
    (``runner.layerwise.output_ranking``: one candidate run per item). An item is a node index, or a
    set of node indices (a tied block position of ``strategies.precision.tied_search``: every block's node at once).

    Args:
        ctx: the run context (its samples; ``lanes`` spread the runs).
        model: the prepared fp32 model.
        everything: indices of every node the candidates may keep (searched and forced).
        maker: builds the "these nodes alone in the low precision" candidates (``runner.lowp.makers``).
        checker: the run's checker (the ranking runs on its device: ``ranking_backend``).
        switchboard: the candidates' switchboard: each candidate runs as its feeds in one session,
            instead of being built: on CPU with graph optimizations off (as the checks run), on the
            checker's device when it judges on ONNX Runtime's CUDA provider (fp16's native one there, int8's own:
            ``_board``; an order, not a verdict: its bits need not be the built candidates'); None, where it
            cannot be built, or for a TensorRT checker: each candidate is built, and run on the checker's device
            or emulated on CPU.

    Attributes:
        facts: ``{"nodes": how many items were ranked, "seconds": how long it took, "switched": whether
            they ran as feeds of the switchboard}`` once it ran (with ``"skipped": "budget"`` where it stopped past
            the budget's allowance, ``"read": True`` where a stored ranking was read), for
            ``summary.json``'s ``ranked_again``; None before.
    """

    def __init__(
        self,
        ctx: RunContext,
        model: onnx.ModelProto,
        everything: FrozenSet[int],
        maker: CandidateMaker,
        checker: Optional[Checker],
        switchboard: Optional[LazySwitchboard] = None,
    ):
        self.ctx, self.model, self.everything, self.maker, self.checker = ctx, model, everything, maker, checker
        self.switchboard, self.low = switchboard, maker.low
        self.facts: Optional[Dict[str, float | bool | str]] = None
        #: the search's budget (``strategies.budget``): a second ranking whose runs, at their pace, would take more
        #: than half of what is left stops and the first ranking stays; None: always made
        self.budget: Optional[Budget] = None

    def __call__(self, items: List[Any]) -> List[Any]:
        """``items`` (node indices, or sets of them) ordered by output error, largest first."""
        labels = {self._label(item): item for item in items}
        key = key_of(
            self.ctx.identity,
            backend=backend_key(self.checker),
            low=self.low.name,
            items=names_digest(sorted(labels)),
            builder=fingerprint(self.model),
            everything=names_digest(sorted(self.model.graph.node[i].name for i in self.everything)),
        )
        stored = self.ctx.rankings.get("output_error", key)
        if stored is not None and sorted(stored) == sorted(labels):
            self.facts = {"nodes": len(items), "seconds": 0.0, "switched": False, "read": True}
            return [labels[label] for label in stored]
        started = time.monotonic()
        log.info(
            "A ranked prefix of %d or more fails: ranking the %d %s again by the output error each makes "
            "alone in %s (one run each), then galloping again",
            REORDER_FROM,
            len(items),
            "units" if items and isinstance(items[0], frozenset) else "nodes",
            self.low,
        )
        backend = ranking_backend(self.checker)
        board = self._board(backend)
        builds: List[Tuple[Any, Callable[[], Made]]]
        if board is not None:
            backend = backend or make_backend("onnxruntime", graph_optimization_level="disable", cpu_arena=False)
            builds = [(item, functools.partial(self._switched, board, item)) for item in items]
        else:
            backend = backend or make_backend(self.low.emulation or "onnxruntime", cpu_arena=False)
            builds = [(item, functools.partial(self._alone, item)) for item in items]
        built = self._alone if board is not None else None
        allowance = self.budget.allowance() if self.budget is not None else None
        try:
            order = output_error_ranking(
                builds, self.model, self.ctx.ranking_samples, backend, self.ctx.lanes, built, allowance
            )
        except RankingAbandoned as e:
            log.info(
                "Stopped ranking the %d units again after %d runs in %.1f s: at that pace it would take more than "
                "half of what was left of the budget (%.0f s); the first ranking stays",
                len(items),
                e.done,
                e.seconds,
                2 * (allowance or 0.0),
            )
            self.facts = {
                "nodes": len(items),
                "seconds": round(e.seconds, 3),
                "switched": board is not None,
                "skipped": "budget",
            }
            return list(items)
        seconds = time.monotonic() - started
        self.facts = {"nodes": len(items), "seconds": round(seconds, 3), "switched": board is not None}
        self.ctx.rankings.put("output_error", key, [self._label(item) for item in order])
        log.info("Ranked again in %.1f s; first: %s", seconds, ", ".join(self._name(item) for item in order[:5]))
        return order

    def _board(self, backend: Optional[Backend]) -> Optional[Switchboard]:
        """The switchboard the ranking runs on: the maker's default one on CPU (``backend`` None); on a device's
        ONNX Runtime provider its native one where it offers it (``RunsOn.DEVICE``, fp16/bf16: no ``If``, each of
        which costs the CUDA provider a cuBLAS handle: the emulation's 1,628 on a 0.5B decoder ran an H200 out of
        memory, measured), else the default one (int8's: a few hundred ``If`` fit; where they do not, the
        ranking builds the candidates, ``output_error_ranking``'s ``built``); none for TensorRT."""
        if self.switchboard is None:
            return None
        if backend is None:
            return self.switchboard.get()
        if not isinstance(backend, OnnxRuntimeBackend):
            return None
        return self.switchboard.get(RunsOn.DEVICE if RunsOn.DEVICE in self.switchboard.offers else None)

    def _label(self, item: Any) -> str:
        """An item's name in a stored ranking: its node's name, or a tied position's node names joined."""
        return "+".join(sorted(self.model.graph.node[i].name for i in self._members(item)))

    def _name(self, item: Any) -> str:
        nodes = sorted(item) if isinstance(item, frozenset) else [item]
        name = self.model.graph.node[nodes[0]].name
        return name if len(nodes) == 1 else f"{name} (+{len(nodes) - 1} tied)"

    @staticmethod
    def _members(item: Any) -> FrozenSet[int]:
        return item if isinstance(item, frozenset) else frozenset([item])

    def _switched(self, board: Switchboard, item: Any) -> Made:
        """The switch feeds of the candidate with ``item`` alone in the low precision."""
        return board, board.feeds(self.everything - self._members(item))

    def _alone(self, item: Any) -> onnx.ModelProto:
        """The model with ``item`` alone in the low precision."""
        kept = self.everything - self._members(item)
        return self.maker.candidate(sorted(self.model.graph.node[k].name for k in kept))


def backend_key(checker: Optional[Checker]) -> Dict[str, Any]:
    """What of the checker's way of running shapes a ranking: its backend, providers and options (a device's
    arithmetic ranks), or ``emulated`` where the ranking runs on CPU (``ranking_backend``)."""
    comparison = checker.comparison() if checker is not None else None
    if comparison is None or not comparison.on_device:
        return {"backend": "emulated"}
    return {"backend": comparison.backend_name, "options": dict(comparison.backend_options)}
