"""Per-node comparison of a target with a reference: accumulated and introduced error.

For each node of the target model (in topological order):

- **accumulated** error: the node's outputs in the target run, every tensor marked as an output,
  against the reference run's values of the same tensors (what ``polygraphy run --onnx-outputs
  mark all`` compares);
- **introduced** error: the node run alone on the target backend, fed the reference values of its
  inputs, against the reference values of its outputs (``runner.graph.isolate``,
  ``runner.layerwise.alone``): what the node itself adds, free of what reached it.

Tensors are matched by name, through the float Casts a precision conversion inserts (as
``checker=compare`` matches them) and through Q/DQ pairs (``runner.graph.qdq``). In a QDQ (int8)
target a node runs alone with its own Q/DQ pairs (its inputs and weights rounded as the target
rounds them), and each pair's own error is measured too (``runner.layerwise.pairs``: the float
tensor against itself quantized and dequantized, with its SQNR). Cost: per chunk of nodes, one
reference run, one target run and one run of the isolated model per sample (a chunk is the whole
model unless its values pass the memory budget); with an executor's lanes the isolated model is
``2 * lanes`` models and the target run goes beside them (``runner.layerwise.alone``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend
from runner.checkers.compare.tolerance import Tolerances, compare_tensor
from runner.executors.spread import HERE
from runner.graph.activations import marked
from runner.graph.feeds import as_declared, graph_inputs
from runner.graph.isolate import weight_names
from runner.graph.qdq import input_chains, is_qdq, qdq_aliases
from runner.graph.weight_file import maps, weight_bytes
from runner.layerwise.alone import AloneRuns
from runner.layerwise.pairs import PairRow, QDQPairs
from runner.layerwise.persistence import trace
from runner.layerwise.tensors import cast_aliases, peak, tensor_types, worse
from runner.lowp.precisions import LOW_PRECISIONS, LowPrecision

log = logging.getLogger(__name__)


@dataclass
class NodeRow:
    """One node's comparison (worst output, worst sample).

    Attributes:
        index: position in the target's topological order (compute nodes only, from 0).
        node: the node's name. op: its op type. outputs: its output tensors.
        tensor: the output the accumulated statistics are for (the one that compares worst).
        magnitude: the largest finite |value| of the node's outputs in the reference.
        weights: the largest finite |value| of the node's weights (initializers, Constant nodes).
        in_range: whether ``magnitude`` and ``weights`` fit the low precision (True without one).
        accumulated: target run vs reference (``OutputStats`` fields).
        introduced: the node alone on reference inputs vs reference (``OutputStats`` fields), or
            None when the node could not be run alone.
        passes: whether the accumulated error is within the checker's tolerance.
        saturated: inputs whose reference values pass the target type's range (fed saturated to
            its largest finite value when run alone): part of the node's introduced error is
            its producer's.
        absorbed_by: for a node whose accumulated error does not reach a graph output, the node
            that absorbs it (``LayerwiseComparison.absorbed``); None otherwise.
    """

    index: int
    node: str
    op: str
    outputs: List[str]
    tensor: str = ""
    magnitude: float = 0.0
    weights: float = 0.0
    in_range: bool = True
    accumulated: Dict[str, Any] = field(default_factory=dict)
    introduced: Optional[Dict[str, Any]] = None
    passes: bool = True
    saturated: List[str] = field(default_factory=list)
    absorbed_by: Optional[str] = None


class LayerwiseComparison:
    """Compares every node of ``target`` with ``reference`` on each sample.

    Args:
        reference: the reference model (fp32, as given).
        target: the model as the target backend runs it (converted to the low precision when the
            run asks for it).
        rows_of: names of the target's nodes to report (others, e.g. Casts a conversion inserted,
            run but are not reported); None reports every compute node.
        weights_of: ``{node name: largest |weight|}`` before any conversion (``weight_peaks``).
        run_reference: ``(model, feeds, key=...) -> {tensor: value}`` for the marked reference model
            (a backend's ``run``; ``key`` names the model for its session cache).
        target_backend: the backend that runs the target and the isolated models.
        rule: the checker's tolerances (first divergence).
        low: float16, bfloat16 or None: the precision whose range ``in_range`` is about.
        chunk_bytes: bytes of one chunk's values (``layerwise.max_memory_mb``), or None for one chunk.
        sizes: ``{tensor: bytes}`` estimates for chunking.
        pairs: compare a QDQ target's Q/DQ pairs (``pair_rows``); precision's ranking needs only
            the nodes.
        excluded: tensors left out of the comparison (``checker.exclude_outputs``): an intermediate tensor is
            not compared (a node whose every output is excluded gets no row), and a divergence reaching only
            excluded graph outputs is absorbed, not a first divergence.
        lanes: where the nodes alone run (``Executor.lanes``: on the run's workers too, each on its
            GPU); default here, one after another. With more than one lane, each group of
            nodes run alone is split into ``2 * len(lanes)`` models (interleaved in topological order, so
            each holds early and late nodes alike) for the lanes to share as they free up.

    Raises:
        ModelError: a backend cannot run a model.
    """

    def __init__(
        self,
        reference: onnx.ModelProto,
        target: onnx.ModelProto,
        rows_of: Optional[Set[str]],
        weights_of: Mapping[str, float],
        run_reference: Callable[..., Dict[str, np.ndarray]],
        target_backend: Backend,
        rule: Tolerances,
        low: Optional[LowPrecision] = None,
        chunk_bytes: Optional[int] = None,
        sizes: Optional[Mapping[str, int]] = None,
        pairs: bool = True,
        lanes: Sequence[Any] = HERE,
        excluded: Optional[Set[str]] = None,
    ):
        self.reference, self.target = reference, target
        self.excluded = set(excluded or ())
        # a large reference's session is not kept: its mapped weights would stay beside the target's
        self.keep_reference_session = not maps(weight_bytes(reference))
        self.weights_of = weights_of
        self.run_reference, self.backend, self.rule, self.low = run_reference, target_backend, rule, low
        ref_names = {i.name for i in reference.graph.input} | {o for n in reference.graph.node for o in n.output}
        self.chains = input_chains(target)
        self.alias = {**qdq_aliases(target, ref_names, self.chains), **cast_aliases(target, ref_names)}
        self.ref_names = ref_names
        self.types = tensor_types(target)
        self.weights = weight_names(target)
        compute = [n for n in target.graph.node if n.op_type != "Constant"]
        self.nodes = [
            n
            for n in compute
            if not is_qdq(n)
            and (rows_of is None or n.name in rows_of)
            and any(o and o not in self.excluded for o in n.output)
        ]
        ref_name = functools.partial(reference_tensor, self.ref_names, self.alias)  # not bound: no cycle
        self.pairs = QDQPairs(reference, target, self.chains, ref_name, rule) if pairs else None
        self.chunks = self._chunks(compute, chunk_bytes, sizes or {})
        self._models: Dict[Tuple[Any, ...], onnx.ModelProto] = {}
        # a key function that holds no reference to this comparison: a bound method would make a reference
        # cycle that keeps both objects, and the target model, until the cyclic collector runs
        self._key = functools.partial(session_key, f"layerwise:{id(self)}")
        self.alone = AloneRuns(target, self.types, self.weights, self.chains, target_backend, self._key, lanes)
        #: seconds ``run`` spent on the reference runs, the target runs with the nodes run alone, and comparing
        self.seconds = dict.fromkeys(["reference", "target and alone", "compare"], 0.0)

    def pair_rows(self) -> List[PairRow]:
        """The Q/DQ pairs compared (``run`` fills them, ``QDQPairs.rows``); empty without Q/DQ or pairs."""
        return self.pairs.rows() if self.pairs is not None else []

    def ref_name(self, tensor: str) -> Optional[str]:
        """The reference tensor holding ``tensor``'s reference value, or None."""
        return reference_tensor(self.ref_names, self.alias, tensor)

    def _chunks(
        self, nodes: Sequence[onnx.NodeProto], budget: Optional[int], sizes: Mapping[str, int]
    ) -> List[List[onnx.NodeProto]]:
        """Consecutive runs of nodes whose values fit ``budget`` bytes (about four copies of each
        output and one of each input are held at once)."""
        if budget is None:
            return [list(nodes)]

        def size(tensor: str) -> int:  # a Q/DQ or Cast output: as large as the float tensor it carries
            return sizes.get(tensor) or sizes.get(self.ref_name(tensor) or "", 0)

        chunks: List[List[onnx.NodeProto]] = [[]]
        used = 0
        for node in nodes:
            cost = sum(4 * size(o) for o in node.output) + sum(size(i) for i in node.input)
            if chunks[-1] and used + cost > budget:
                chunks.append([])
                used = 0
            chunks[-1].append(node)
            used += cost
        if len(chunks) > 1:
            log.info(
                "Tensor values exceed the memory budget (%g MiB): comparing in %d chunks of nodes",
                budget / 2**20,
                len(chunks),
            )
        return chunks

    def run(self, samples: Sequence[Mapping[str, np.ndarray]]) -> List[NodeRow]:
        """Compare every reported node on every sample.

        Args:
            samples: feed dicts for the reference model's inputs.

        Returns:
            One row per reported node, in topological order.

        Raises:
            ModelError: a backend cannot run the reference, the target or an isolated model.
        """
        reported = {n.name for n in self.nodes}
        rows: Dict[str, NodeRow] = {
            n.name: NodeRow(
                i,
                n.name,
                n.op_type,
                [o for o in n.output if o and o not in self.excluded],
                weights=self.weights_of.get(n.name, 0.0),
            )
            for i, n in enumerate(self.nodes)
        }
        with self.alone.on_lanes():
            for chunk in self.chunks:
                for feeds in samples:
                    self._compare_chunk(chunk, feeds, rows, reported)
        known = LOW_PRECISIONS.get(str(self.low))
        limit = known.max_finite if known is not None else float("inf")
        for row in rows.values():
            row.in_range = max(row.magnitude, row.weights) <= limit
        return [rows[n.name] for n in self.nodes]

    def absorbed(self, rows: Sequence[NodeRow], diverges: Callable[[NodeRow], bool]) -> Dict[str, Optional[str]]:
        """The rows that ``diverges`` but whose divergence never reaches a graph output, each with the
        node that absorbs it (``runner.layerwise.persistence.trace`` on the target graph).

        Args:
            rows: the rows ``run`` returned.
            diverges: whether a row's accumulated error counts as a divergence.

        Returns:
            ``{absorbed node: absorbing node, or None when nothing reads its outputs}``.
        """
        judged, diverging = {r.node for r in rows}, {r.node for r in rows if diverges(r)}
        _, absorbed = trace(self.target, judged, diverging, self.excluded)
        return absorbed

    def _compare_chunk(
        self,
        chunk: List[onnx.NodeProto],
        feeds: Mapping[str, np.ndarray],
        rows: Dict[str, NodeRow],
        reported: Set[str],
    ) -> None:
        outs = [o for n in chunk for o in n.output if o]
        reads = [i for n in chunk for i in n.input if i and i not in self.weights]
        needed = [self.ref_name(t) for t in outs + reads]
        start = time.perf_counter()
        reference = self._built(("reference", id(chunk)), lambda: marked(self.reference, [n for n in needed if n]))
        key = self._key("reference", chunk) if self.keep_reference_session else None
        ref = self.run_reference(reference, feeds, key=key)
        lap = self._lap("reference", start)
        ref = {**{k: np.asarray(v) for k, v in feeds.items()}, **ref}

        def ref_value(tensor: str) -> Optional[np.ndarray]:
            name = self.ref_name(tensor)
            return None if name is None else ref.get(name)

        target_feeds = {
            i.name: as_declared(np.asarray(feeds[i.name]), i.type.tensor_type.elem_type)
            for i in graph_inputs(self.target)
            if i.name in feeds
        }
        target = self._built(("target", id(chunk)), lambda: marked(self.target, outs))
        got, alone, saturated = self.alone.run(chunk, ref_value, (target, target_feeds, self._key("target", chunk)))
        lap = self._lap("target and alone", lap)
        if self.pairs is not None:
            self.pairs.compare(alone, ref_value)
        nodes = [node for node in chunk if node.name in reported]

        def compared(node: onnx.NodeProto) -> List[Tuple[str, Dict[str, Any], Optional[Dict[str, Any]], float]]:
            """(output, accumulated, introduced or None, peak |golden|) of each output of ``node``."""
            found = []
            for o in rows[node.name].outputs:
                golden = ref_value(o)
                if golden is None or o not in got or golden.dtype.kind not in "biuf":
                    continue
                atol, rtol = self.rule.for_output(o)
                acc = asdict(compare_tensor(got[o], golden, atol, rtol, self.rule, light=True))
                intro = None
                if o in alone:
                    intro = asdict(compare_tensor(alone[o], golden, atol, rtol, self.rule, light=True))
                found.append((o, acc, intro, peak(golden)))
            return found

        # numpy lets go of the GIL over a tensor's values: the comparisons take the machine's cores
        with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="compare") as pool:
            for node, found in zip(nodes, pool.map(compared, nodes)):
                row = rows[node.name]
                row.saturated = sorted(set(row.saturated) | {i for i in node.input if i in saturated})
                for o, acc, intro, magnitude in found:
                    if not row.accumulated or worse(acc, row.accumulated):
                        row.accumulated, row.tensor, row.passes = acc, o, acc["passed"]
                    row.magnitude = max(row.magnitude, magnitude)
                    if intro is not None and (row.introduced is None or worse(intro, row.introduced)):
                        row.introduced = intro
        self._lap("compare", lap)

    def _lap(self, phase: str, since: float) -> float:
        """Add the seconds since ``since`` to ``phase``; return now."""
        now = time.perf_counter()
        self.seconds[phase] += now - since
        return now

    def _built(self, what: Tuple[Any, ...], build: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
        """A model of the chunk being compared, built once for all samples (the models of one chunk
        at a time are held)."""
        if what not in self._models:
            if what[0] == "reference":
                self._models.clear()  # a new chunk: the previous chunk's models are done with
                self.alone.clear()
            self._models[what] = build()
        return self._models[what]


def session_key(prefix: str, kind: str, what: Any) -> str:
    """A backend session cache key for a model of one comparison (``prefix`` names it; sessions live
    across samples): ``kind`` ("reference", "target", "alone") and the chunk or node names it runs."""
    return f"{prefix}:{kind}:{hash(tuple(what) if kind == 'alone' else id(what))}"


def reference_tensor(names: Set[str], alias: Mapping[str, str], tensor: str) -> Optional[str]:
    """The reference tensor holding target tensor ``tensor``'s value: itself when the reference has it
    (``names``), else its alias (a Q/DQ chain's or Cast's source), else None."""
    return tensor if tensor in names else alias.get(tensor)
