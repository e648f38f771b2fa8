"""``mode=reduce``: shrink a failing ONNX model to a minimal failing subgraph.

Candidates are node sets (see ``runner.graph.subgraph``); ``SetSearch`` with the chosen marker
finds, one round per needed node, a set whose subgraph still fails and from which no single
node can be dropped (under a monotone failure). ``reduce_inputs=false`` closes every candidate
under ancestors (it keeps the original graph inputs), ``reduce_outputs=false`` under
descendants (it keeps the original graph outputs), as Polygraphy's ``--no-reduce-*`` do.

Before the search: iteration 1 checks the user's model exactly as given (it must fail), then the
whole model as extraction rewrites it (Constant nodes as initializers); if that passes, the
rewrite hid the failure, so the run says so and keeps Constant nodes as nodes. After the search,
if no check passed, one control candidate without the answer's nodes is checked: a check that
fails on it too fails whatever the model holds, and the run says so instead of naming a culprit.
"""
from __future__ import annotations

import functools
import logging
import shutil
from functools import partial
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import onnx
from hydra.utils import get_class

from runner.errors import ConfigError, NothingToDoError
from runner.graph.feeds import check_input_shapes, model_feeds
from runner.graph.load import check_saved, load_model, save_model
from runner.graph.meta import TensorMeta
from runner.graph.subgraph import GraphIndex
from runner.outputs import model_files
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
        source_path: the user's model file; iteration 1 checks a byte copy of it (None: the loaded
            model, saved again).

    Raises:
        ConfigError: when both reductions are off (nothing could change).
    """

    @property
    def needs_pass(self) -> bool:  # type: ignore[override]
        """A reduced answer rests on some check passing; the unreduced model itself does not."""
        return self.final is None or self.final != self.closure(self.full)

    def __init__(self, index: GraphIndex, marker_cls: type, reduce_inputs: bool = True, reduce_outputs: bool = True,
                 output: Path = Path("reduced.onnx"), min_good: Optional[Path] = None, save_opts: Optional[Dict[str, Any]] = None,
                 source_path: Optional[Path] = None):
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
        self.source_path = Path(source_path) if source_path else None
        self.order = list(index.units) if reduce_outputs else list(reversed(index.units))
        self.search: SetSearch[int] = SetSearch(self.order, marker_cls)
        self.marker_name = getattr(marker_cls, "__name__", str(marker_cls))
        self.full = frozenset(index.units)
        #: "original" (the user's file), "rewritten" (the whole model as extracted), "search", "control", "done"
        self.phase = "original"
        self.passed_any = False
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
        output = Path(cfg.output or "reduced.onnx")
        return cls(
            index, get_class(cfg.marker._target_), cfg.reduce_inputs, cfg.reduce_outputs, output,
            Path(cfg.min_good) if cfg.min_good else None,
            {"external_data": cfg.external_data, "threshold": cfg.external_data_threshold},
            Path(cfg.model),
        )

    def closure(self, units: FrozenSet[int]) -> FrozenSet[int]:
        """The candidate for a unit set: closed under ancestors/descendants when a reduction is off.

        Computed on demand by a graph walk (time linear in the nodes reached), not from per-node
        ancestor sets, whose memory grows with the square of the node count.
        """
        out = set(units)
        if not self.reduce_inputs:
            out |= self.index.reachable(out, upward=True)
        if not self.reduce_outputs:
            out |= self.index.reachable(out, upward=False)
        return frozenset(out)

    def _original(self) -> Candidate:
        """Iteration 1: the user's model exactly as given (a byte copy of the file; a model with
        external data is saved again, with its tensors in ``<artifact>.data``)."""
        self._pending = self.full
        model = self.index.model
        single_file = self.source_path is not None and len(model_files(self.source_path)) == 1

        def write(path: Path) -> None:
            if single_file:
                assert self.source_path is not None
                shutil.copyfile(self.source_path, path)
            else:  # saving with external data moves tensors out of the proto it is given: save a copy
                copy = onnx.ModelProto()
                copy.CopyFrom(model)
                save_model(copy, path, **{**self.save_opts, "external_data": True})

        n = len(self.index.nodes)
        key = f"{self.index.fingerprint}:original"
        return Candidate(key, f"your model as given: {n} nodes", write, {"nodes": n}, payload=lambda: model)

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
        """The user's model, the whole model as extracted (both must fail), the set search's
        candidates, then a control candidate when no check passed."""
        if self.phase == "original":
            return self._original()
        if self.phase == "rewritten":
            kept = "Constant nodes kept" if self.index.keep_constant_nodes else "Constant nodes as initializers"
            return self._candidate(self.full, f"whole model as extracted ({kept})")
        if self.phase == "search":
            units = self.search.next()
            if units is not None:
                label = (f"the {len(units)} needed node(s) alone" if self.search.probing
                         else f"round {self.search.rounds + 1}, searching for needed node {len(self.search.required) + 1}")
                return self._candidate(self.closure(units), label)
            self.final = self.closure(self.search.result or frozenset(self.full))
            control = None if self.passed_any else self._control_units()
            if control is None:
                self.phase = "done"
                return None
            self.phase = "control"
            return self._candidate(control, "control: nodes outside the answer (no check has passed yet)")
        return None

    def _control_units(self) -> Optional[FrozenSet[int]]:
        """One unit whose candidate holds none of the answer's nodes (the last such in the search
        order), or None when every candidate would hold some of them."""
        assert self.final is not None
        for u in reversed(self.order):
            if u not in self.final:
                units = self.closure(frozenset([u]))
                if not units & self.final:
                    return units
        return None

    def take_verdict(self, candidate: Candidate, verdict: Verdict) -> None:
        """Feed a verdict to the search.

        Raises:
            NothingToDoError: the user's model passes, or the whole model passes as extracted
                even with Constant nodes kept.
        """
        assert self._pending is not None
        if verdict.passed and self.phase not in ("original", "rewritten"):
            self.passed_any = True
        if self.phase == "original":
            if verdict.passed:
                raise NothingToDoError(
                    "the check passes on the unreduced model (your file as given), so there is no failure to reduce; "
                    "check the check command (or its fail_codes/fail_regex) on the model first"
                )
            self.phase = "rewritten"
        elif self.phase == "rewritten":
            if not verdict.passed:
                self.phase = "search"
            elif not self.index.keep_constant_nodes:
                log.warning("The check fails on your model but passes once its Constant nodes become initializers: the "
                            "failure needs Constant nodes, so they are kept as nodes (keep_constant_nodes=true)")
                self.index.keep_constant_nodes = True
            else:
                raise NothingToDoError(
                    "the check fails on your model but passes on the same nodes re-exported by onnx-graphsurgeon, so "
                    "no subgraph can show the failure; the failure depends on how the file is written, not on its nodes"
                )
        elif self.phase == "control":
            self.phase = "done"
        else:
            if verdict.passed:
                self._passing.append((len(self._pending), self._pending))
            self.search.step(not verdict.passed)

    def remaining(self) -> Optional[int]:
        """Checks left in the current round (later rounds are unknown)."""
        before = {"original": 2, "rewritten": 1}.get(self.phase, 0)
        return before + (self.search.remaining() if self.phase in ("original", "rewritten", "search") else 0)

    def state(self) -> Dict[str, Any]:
        """Rounds done and the nodes found necessary so far."""
        return {"phase": self.phase, "rounds": self.search.rounds, "necessary": self.index.describe(self.search.required)}

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
            "keep_constant_nodes": self.index.keep_constant_nodes,
            "output": str(self.output),
            "min_good": getattr(self, "min_good_written", None),
            "rounds": self.search.rounds,
            "marker": self.marker_name,
            "reduced_nodes": self.index.describe(units),
            "reduced_inputs": inputs,
            "reduced_outputs": outputs,
        }
