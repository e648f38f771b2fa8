"""``mode=reduce``: shrink a failing ONNX model to a minimal failing subgraph.

Candidates are node sets (see ``runner.graph.subgraph``); ``SetSearch`` with the chosen marker
finds, one round per needed node, a set whose subgraph still fails and from which no single
node can be dropped (under a monotone failure). ``reduce_inputs=false`` closes every candidate
under ancestors (it keeps the original graph inputs), ``reduce_outputs=false`` under
descendants (it keeps the original graph outputs), as Polygraphy's ``--no-reduce-*`` do.
"""
from __future__ import annotations

import functools
import logging
from functools import partial
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from hydra.utils import get_class

from runner.errors import ConfigError, NothingToDoError
from runner.graph.feeds import check_input_shapes, model_feeds
from runner.graph.load import check_saved, load_model, save_model
from runner.graph.meta import TensorMeta
from runner.graph.subgraph import GraphIndex
from runner.paths import output_path
from strategies.base import Candidate, Strategy, Verdict
from strategies.set_search import SetSearch

log = logging.getLogger(__name__)


class ReduceStrategy(Strategy):
    """Generates subgraph candidates of a model and keeps shrinking the failing ones.

    Args:
        index: the model's node index.
        marker_cls: the boundary marker class (bisect, linear or minimal).
        reduce_inputs: allow intermediate tensors to become graph inputs.
        reduce_outputs: allow intermediate tensors to become graph outputs.
        output: where the reduced model is written.
        min_good: where the largest passing candidate close in size is written, or None.
        save_opts: ``external_data`` and ``threshold`` for ``save_model``.

    Raises:
        ConfigError: when both reductions are off (nothing could change).
    """

    def __init__(self, index: GraphIndex, marker_cls: type, reduce_inputs: bool = True, reduce_outputs: bool = True,
                 output: Path = Path("reduced.onnx"), min_good: Optional[Path] = None, save_opts: Optional[Dict[str, Any]] = None):
        if not reduce_inputs and not reduce_outputs:
            raise ConfigError("reduce_inputs=false and reduce_outputs=false leave nothing to reduce; enable at least one")
        self.index = index
        self.source_model = index.model
        #: every tensor's value from the shape fallback run, when there was one (reused by checker=compare)
        self.activations = index.meta.activations
        self.reduce_inputs = reduce_inputs
        self.reduce_outputs = reduce_outputs
        self.output = Path(output)
        self.min_good = Path(min_good) if min_good else None
        self.save_opts = save_opts or {}
        self.ancestors, self.descendants = self._reachability()
        order = list(index.units) if reduce_outputs else list(reversed(index.units))
        self.search: SetSearch[int] = SetSearch(order, marker_cls)
        self.marker_name = getattr(marker_cls, "__name__", str(marker_cls))
        self.full = self.closure(frozenset(index.units))
        self._verified = False
        self._pending: Optional[FrozenSet[int]] = None
        self._passing: List[Tuple[int, FrozenSet[int]]] = []
        self.final: Optional[FrozenSet[int]] = None
        self.nodes_before = len(index.nodes)

    @classmethod
    def from_config(cls, cfg: Any) -> "ReduceStrategy":
        """Load ``cfg.model``, infer its tensor shapes and index it.

        Raises:
            ModelError: bad model file or graph. ConfigError: bad options.
        """
        model = load_model(cfg.model)
        shapes = check_input_shapes(model, cfg.model_input_shapes)
        meta = TensorMeta(model, shapes, partial(model_feeds, model, shapes, cfg.inputs, cfg.seed))
        index = GraphIndex(model, meta, keep_constant_nodes=cfg.keep_constant_nodes)
        output = output_path(cfg.output, "reduced.onnx")
        return cls(
            index, get_class(cfg.marker._target_), cfg.reduce_inputs, cfg.reduce_outputs, output,
            Path(cfg.min_good) if cfg.min_good else None,
            {"external_data": cfg.external_data, "threshold": cfg.external_data_threshold},
        )

    def _reachability(self) -> Tuple[Dict[int, FrozenSet[int]], Dict[int, FrozenSet[int]]]:
        anc: Dict[int, FrozenSet[int]] = {}
        for u in self.index.units:
            acc = set()
            for p in self.index.unit_parents(u):
                acc |= {p} | anc[p]
            anc[u] = frozenset(acc)
        desc: Dict[int, set] = {u: set() for u in self.index.units}
        for u in reversed(self.index.units):
            for p in self.index.unit_parents(u):
                desc[p] |= {u} | desc[u]
        return anc, {u: frozenset(d) for u, d in desc.items()}

    def closure(self, units: FrozenSet[int]) -> FrozenSet[int]:
        """The candidate for a unit set: closed under ancestors/descendants when a reduction is off."""
        out = set(units)
        if not self.reduce_inputs:
            for u in units:
                out |= self.ancestors[u]
        if not self.reduce_outputs:
            for u in list(out):
                out |= self.descendants[u]
        return frozenset(out)

    def _candidate(self, units: FrozenSet[int], label: str) -> Candidate:
        self._pending = units
        order, inputs, outputs = self.index.boundary(units)
        n = self.index.node_count(order)
        model = functools.cache(lambda: self.index.extract(units))

        def write(path: Path) -> None:
            save_model(model(), path, **self.save_opts)

        info = {"nodes": n, "units": len(units), "inputs": inputs, "outputs": outputs}
        return Candidate(self.index.key(units), f"{label}: {n} nodes", write, info, payload=model)

    def next_candidate(self) -> Optional[Candidate]:
        """First the whole model (it must fail), then the set search's candidates."""
        if not self._verified:
            return self._candidate(self.full, "original model")
        units = self.search.next()
        if units is None:
            self.final = self.closure(self.search.result or frozenset(self.full))
            return None
        label = (f"the {len(units)} needed node(s) alone" if self.search.probing
                 else f"round {self.search.rounds + 1}, searching for needed node {len(self.search.required) + 1}")
        return self._candidate(self.closure(units), label)

    def take_verdict(self, candidate: Candidate, verdict: Verdict) -> None:
        """Feed a verdict to the search; the original model passing raises NothingToDoError."""
        assert self._pending is not None
        if not self._verified:
            if verdict.passed:
                raise NothingToDoError(
                    "the check passes on the unreduced model, so there is no failure to reduce; "
                    "check the check command (or its fail_codes/fail_regex) on the original model first"
                )
            self._verified = True
            return
        if verdict.passed:
            self._passing.append((len(self._pending), self._pending))
        self.search.step(not verdict.passed)

    def remaining(self) -> Optional[int]:
        """Checks left in the current round (later rounds are unknown)."""
        return 1 + self.search.remaining() if not self._verified else self.search.remaining()

    def state(self) -> Dict[str, Any]:
        """Rounds done and the nodes found necessary so far."""
        return {"rounds": self.search.rounds, "necessary": self.index.describe(self.search.required)}

    def _min_good_set(self) -> Optional[FrozenSet[int]]:
        """Polygraphy's choice: the largest passing candidate smaller than the result, else the
        smallest passing one larger than it."""
        assert self.final is not None
        size = len(self.final)
        smaller = [p for p in self._passing if p[0] < size]
        if smaller:
            return max(smaller, key=lambda p: p[0])[1]
        larger = [p for p in self._passing if p[0] >= size]
        return min(larger, key=lambda p: p[0])[1] if larger else None

    def finish(self) -> None:
        """Write the reduced model (checked with onnx.checker) and the min-good model if asked."""
        assert self.final is not None
        save_model(self.index.extract(self.final), self.output, **self.save_opts)
        check_saved(self.output)
        log.info("Reduced model: %s (%d of %d nodes)", self.output, self.index.count_nodes(self.final), self.nodes_before)
        self.min_good_written = None
        if self.min_good is not None:
            good = self._min_good_set()
            if good is None:
                log.warning("No passing candidate was seen; min_good=%s not written", self.min_good)
            else:
                save_model(self.index.extract(good), self.min_good, **self.save_opts)
                self.min_good_written = str(self.min_good)

    def result(self) -> Dict[str, Any]:
        """``nodes_before``, ``nodes_after``, ``output`` and the nodes kept, for summary.json."""
        assert self.final is not None
        _, inputs, outputs = self.index.boundary(self.final)
        units = sorted(self.final)
        return {
            "nodes_before": self.nodes_before,
            "nodes_after": self.index.count_nodes(self.final),
            "compute_nodes_before": len(self.index.units),
            "compute_nodes_after": len(self.final),
            "output": str(self.output),
            "min_good": getattr(self, "min_good_written", None),
            "rounds": self.search.rounds,
            "marker": self.marker_name,
            "reduced_nodes": self.index.describe(units),
            "reduced_inputs": inputs,
            "reduced_outputs": outputs,
        }
