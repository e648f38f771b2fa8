"""Node-level view of a model, and extraction of the subgraph made of any set of nodes.

Search units are the non-constant nodes: Constant nodes, and nodes whose inputs are all
constant, travel with the units that use them and never become graph inputs; initializers
stay initializers. A node with subgraphs (If, Loop, Scan) is one unit, and the outer-scope
tensors its bodies read count as its inputs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from runner.errors import ModelError, ShapeError
from runner.graph.boundary import Boundaries
from runner.graph.constants import constants_to_initializers
from runner.graph.load import fingerprint, is_large
from runner.graph.meta import TensorMeta
from runner.graph.parts_exporter import PartsExporter
from runner.graph.sessions import loads_on_cpu

log = logging.getLogger(__name__)

#: how many unit sets' boundaries ``GraphIndex.boundary`` keeps
BOUNDARIES_KEPT = 8


def _subgraphs(node: gs.Node) -> List[gs.Graph]:
    found = []
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, gs.Graph))
    return found


def _outer_reads(graph: gs.Graph) -> Set[str]:
    """Names of tensors a (sub)graph body reads from enclosing scopes."""
    produced = {t.name for n in graph.nodes for t in n.outputs} | {t.name for t in graph.inputs}
    reads: Set[str] = set()
    for n in graph.nodes:
        for t in n.inputs:
            if t.name and not isinstance(t, gs.Constant) and t.name not in produced:
                reads.add(t.name)
        for sub in _subgraphs(n):
            reads |= {name for name in _outer_reads(sub) if name not in produced}
    return reads


def _output_under(model: onnx.ModelProto, names: Dict[str, str]) -> None:
    """Output each graph output ``t`` of ``names`` as ``names[t]`` instead, through an ``Identity`` node
    (``t`` stays the tensor its consumers read), in place."""
    for output in model.graph.output:
        name = names.get(output.name)
        if name is not None:
            model.graph.node.append(onnx.helper.make_node("Identity", [output.name], [name], name=name))
            output.name = name


def _inputs_to_initializers(model: onnx.ModelProto, values: Dict[str, np.ndarray]) -> None:
    """Turn the graph inputs named in ``values`` into initializers holding those values, in place."""
    from onnx import numpy_helper

    kept = [i for i in model.graph.input if i.name not in values]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())


class GraphIndex:
    """Index of a model's nodes for subgraph extraction.

    Args:
        model: the model (not modified).
        meta: dtype and concrete shape of tensors that may become graph inputs or outputs.
        shape_hint: the option that supplies missing shapes, named in errors.
        keep_constant_nodes: keep carried Constant nodes as nodes; by default extracted
            subgraphs hold them as initializers (same tensor names), as Polygraphy's do.

    Attributes:
        nodes: the graph's nodes in topological order (gs.Node).
        units: indices of the non-constant nodes, in topological order.

    Raises:
        ModelError: empty graph, a cycle, or a tensor that nothing provides (missing initializer).
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        meta: TensorMeta,
        shape_hint: str = "model_input_shapes",
        keep_constant_nodes: bool = False,
    ):
        self.model = model
        self.keep_constant_nodes = keep_constant_nodes
        self.meta = meta
        self.shape_hint = shape_hint
        if not model.graph.node:
            raise ModelError("the model's graph has no nodes; there is nothing to reduce")
        self.graph = gs.import_onnx(model)
        self._check_sorted()
        self.nodes: List[gs.Node] = list(self.graph.nodes)
        self.graph_inputs = {t.name for t in self.graph.inputs}
        self.graph_outputs = [t.name for t in self.graph.outputs]
        self.producer: Dict[str, int] = {}
        self.consumers: Dict[str, List[int]] = {}
        self.reads: List[List[str]] = []
        for i, node in enumerate(self.nodes):
            for t in node.outputs:
                if t.name:
                    self.producer[t.name] = i
        for i, node in enumerate(self.nodes):
            names = [t.name for t in node.inputs if t.name and not isinstance(t, gs.Constant)]
            for sub in _subgraphs(node):
                names += sorted(_outer_reads(sub) - set(names))
            self.reads.append(names)
            for name in names:
                self.consumers.setdefault(name, []).append(i)
                if name not in self.producer and name not in self.graph_inputs:
                    raise ModelError(
                        f"node {node.name or i} ({node.op}) reads tensor {name!r}, which no node, graph input or "
                        "initializer provides; fix the model"
                    )
        self.const = self._constant_nodes(fold=True)
        #: a model all of whose nodes fold to constants (no graph input reaches them) is reduced over its
        #: non-Constant nodes, and a boundary tensor of a candidate becomes an initializer holding its
        #: value, as Polygraphy does: backend bugs in constant folding are what users reduce
        self.folded_boundary = all(self.const)
        if self.folded_boundary:
            self.const = self._constant_nodes(fold=False)
        self._folded_values: Optional[Dict[str, np.ndarray]] = None
        self.const_deps: List[Set[int]] = []
        for i in range(len(self.nodes)):
            deps: Set[int] = set()
            for name in self.reads[i]:
                p = self.producer.get(name)
                if p is not None and self.const[p]:
                    deps |= {p} | self.const_deps[p]
            self.const_deps.append(deps)
        self.units: List[int] = [i for i in range(len(self.nodes)) if not self.const[i]]
        if not self.units:
            raise ModelError("every node of the model is a Constant node; there is nothing to reduce")
        self.fingerprint = fingerprint(model)
        #: name -> gs.Tensor of the whole graph, made once (extraction reads it for every candidate)
        self.tensor_map: Dict[str, gs.Tensor] = self.graph.tensors()
        #: the latest ``boundary`` results by unit set (a candidate's label, info and model ask for it, and a
        #: round's candidates are built together)
        #: (nodes, inputs, outputs, how many of the outputs are the boundary rather than ``marked`` tensors)
        self._boundaries: OrderedDict[FrozenSet[int], Tuple[List[int], List[str], List[str], int]] = OrderedDict()
        self._edges: Optional[Boundaries] = None  # made on the first ``boundary``
        self._constant: Optional[Tuple[np.ndarray, np.ndarray]] = None  # ``_constant_flags``
        #: writes a candidate's graph from the parts of this one, each exported once
        self.exporter = PartsExporter(model, self.graph, self.nodes, self.tensor_map)
        #: tensors every candidate outputs where it computes them, besides its boundary (``mark``)
        self.marked: FrozenSet[str] = frozenset()
        #: the names the marked outputs of a candidate are written under (``mark``); None: their own
        self.rename: Optional[Callable[[List[str], List[str]], Dict[str, str]]] = None

    def mark(
        self, tensors: Iterable[str], rename: Optional[Callable[[List[str], List[str]], Dict[str, str]]] = None
    ) -> int:
        """Make every candidate output each of ``tensors`` that it computes (not only its boundary): the
        tensors a check compares with golden values of the full model computed with every tensor an output,
        which a candidate then computes as that run did (no fusion across them).

        Args:
            tensors: tensor names; those no non-constant node computes are left out.
            rename: given a candidate's boundary outputs and its marked ones, the names to output marked
                tensors under (``{tensor: name}``; each through an ``Identity`` node); None: their own.

        Returns:
            How many of ``tensors`` are non-constant tensors of the model.
        """
        self.marked = frozenset(
            t for t in tensors if t in self.producer and not self.const[self.producer[t]] and self.meta.get(t)
        )
        self.rename = rename
        self._boundaries.clear()
        return len(self.marked)

    def _constant_nodes(self, fold: bool) -> List[bool]:
        """Per node: a Constant node, or (``fold``) a node without bodies whose inputs all come from
        constant nodes (it travels with its consumers and is never a unit of the search)."""
        const: List[bool] = []
        for i, node in enumerate(self.nodes):
            const.append(
                node.op == "Constant"
                or (
                    fold
                    and bool(node.inputs)
                    and not _subgraphs(node)
                    and all(self.producer.get(n) is not None and const[self.producer[n]] for n in self.reads[i])
                )
            )
        return const

    def _values_of(self, names: List[str]) -> Dict[str, np.ndarray]:
        """The values of constant tensors ``names`` (one ONNX Runtime run of the whole model, which
        takes no input, made on first use)."""
        if self._folded_values is None:
            from runner.graph.activations import run_all_tensors

            self._folded_values = run_all_tensors(self.model, {})
        return {n: self._folded_values[n] for n in names}

    def _check_sorted(self) -> None:
        seen = {t.name for t in self.graph.inputs}
        later = {t.name for n in self.graph.nodes for t in n.outputs}
        for n in self.graph.nodes:
            for t in n.inputs:
                if t.name and not isinstance(t, gs.Constant) and t.name not in seen and t.name in later:
                    try:
                        self.graph.toposort()
                    except Exception:
                        raise ModelError(
                            f"the graph has a cycle through node {n.name or n.op!r}; fix the model"
                        ) from None
                    return
            seen |= {t.name for t in n.outputs}

    def unit_parents(self, i: int) -> Set[int]:
        """Non-constant nodes whose outputs node ``i`` reads."""
        return {self.producer[n] for n in self.reads[i] if n in self.producer and not self.const[self.producer[n]]}

    def unit_children(self, i: int) -> Set[int]:
        """Non-constant nodes that read an output of node ``i``."""
        return {c for t in self.nodes[i].outputs if t.name for c in self.consumers.get(t.name, ()) if not self.const[c]}

    def reachable(self, units: Iterable[int], upward: bool) -> Set[int]:
        """Every unit reachable from ``units`` through parents (``upward``) or children, ``units`` excluded.

        A graph walk on demand: time linear in the nodes and edges reached, no stored per-node sets.
        """
        start = set(units)
        step = self.unit_parents if upward else self.unit_children
        seen: Set[int] = set()
        frontier = list(start)
        while frontier:
            for nxt in step(frontier.pop()):
                if nxt not in seen and nxt not in start:
                    seen.add(nxt)
                    frontier.append(nxt)
        return seen

    def boundary(self, units: Iterable[int]) -> tuple[List[int], List[str], List[str]]:
        """The nodes, graph inputs and graph outputs of the subgraph made of ``units``.

        Returns:
            (node indices with their constant dependencies, sorted; input tensor names;
            output tensor names). Outputs are the units' tensors that are original graph
            outputs, or that a node outside the set reads and no node in it does (Polygraphy's
            rule: an extra output changes what TensorRT may fuse, so a fusion-dependent failure
            could vanish); when that leaves none, the tensors nothing reads; then the ``marked``
            tensors the units compute (``mark``).
        """
        order, inputs, outputs, _ = self._boundary(frozenset(units))
        return order, inputs, outputs

    def renamed(self, units: Iterable[int]) -> Dict[str, str]:
        """The outputs ``extract(units)`` writes under other names (``mark``'s ``rename``): ``{tensor: name}``."""
        _, _, outputs, plain = self._boundary(frozenset(units))
        if self.rename is None or plain == len(outputs):
            return {}
        return self.rename(outputs[:plain], outputs[plain:])

    def _boundary(self, keep: FrozenSet[int]) -> Tuple[List[int], List[str], List[str], int]:
        """``boundary``, and how many of its outputs come before the ``marked`` ones."""
        if keep in self._boundaries:
            self._boundaries.move_to_end(keep)
            return self._boundaries[keep]
        if self._edges is None:
            writes = [[t.name for t in node.outputs if t.name] for node in self.nodes]
            self._edges = Boundaries(self.reads, writes, self.const_deps, self.graph_outputs)
        order, inputs, outputs, dangling = self._edges.boundary(keep)
        if not outputs:
            outputs = [n for n in dangling if self.meta.get(n) is not None]
        plain = len(outputs)
        if self.marked:
            known, fed = set(outputs), set(inputs)
            computed = [t.name for i in order if not self.const[i] for t in self.nodes[i].outputs]
            outputs = outputs + [t for t in computed if t in self.marked and t not in known and t not in fed]
        self._boundaries[keep] = (order, inputs, outputs, plain)
        while len(self._boundaries) > BOUNDARIES_KEPT:
            self._boundaries.popitem(last=False)
        return order, inputs, outputs, plain

    def concrete_io(
        self,
        units: Iterable[int],
        symbolic: onnx.ModelProto,
        load: Optional[Callable[[onnx.ModelProto], onnx.ModelProto]] = None,
    ) -> onnx.ModelProto:
        """``units`` as ``extract(units, concrete=True)`` makes them (the model's own graph inputs
        and outputs with the concrete shapes the run measured), when that changes their declarations
        and ONNX Runtime on CPU loads the result; else ``symbolic``, the same units extracted with
        symbolic dimensions (an If branch that a concrete shape makes inconsistent can refuse it).

        Args:
            units: the unit indices, closed as the candidate is.
            symbolic: ``extract(units)``.
            load: reads the model's weights back in (shared weights); None: the model holds them.

        Returns:
            The model chosen, ``load`` applied once. A model past 2 GB is not test-loaded here (it is
            checked as written once saved).
        """
        loaded = load if load is not None else (lambda m: m)
        try:
            concrete = self.extract(units, concrete=True)
        except ShapeError:
            return loaded(symbolic)
        declared = [[v.type for v in m.graph.input] + [v.type for v in m.graph.output] for m in (concrete, symbolic)]
        if declared[0] == declared[1]:
            return loaded(symbolic)
        whole = loaded(concrete)
        if is_large(whole):
            return whole
        refused = loads_on_cpu(whole)
        if refused is not None:
            log.info(
                "The answer keeps symbolic input/output dims: with concrete ones ONNX Runtime refuses it (%s)", refused
            )
            return loaded(symbolic)
        return whole

    def extract(self, units: Iterable[int], concrete: bool = False) -> onnx.ModelProto:
        """The subgraph made of ``units`` as a model, with original opsets, domains and metadata.

        Boundary tensors are declared with their concrete dtype and shape (from ``meta``: shape
        inference with ``model_input_shapes``, else one ONNX Runtime run). The model's own graph
        inputs and outputs keep their declaration when it has a shape (symbolic dimensions stay:
        made concrete, they can make ONNX Runtime's static inference of an If branch the sample
        never takes fail at load), unless ``concrete``; one declared without a shape gets the
        concrete one.

        Raises:
            ShapeError: when a boundary tensor has no known dtype or shape.
        """
        order, inputs, outputs = self.boundary(units)
        tensors = self.tensor_map
        original = set(self.graph_inputs) | set(self.graph_outputs)
        saved = {}
        try:
            for name in inputs + outputs:
                m = self.meta.get(name)
                declared = name in original and tensors[name].shape is not None and tensors[name].dtype
                if declared and (not concrete or m is None):
                    continue
                if m is None:
                    why = (
                        f" and ONNX Runtime could not run the model ({self.meta.fallback_error})"
                        if self.meta.fallback_error
                        else ""
                    )
                    raise ShapeError(
                        f"tensor {name!r} has no known dtype/shape: shape inference could not infer it{why}; "
                        f"give input shapes with {self.shape_hint}={{input:[dims]}} "
                        "or real inputs with inputs=feeds.npz"
                    )
                t = tensors[name]
                saved[name] = (t.dtype, t.shape)
                t.dtype, t.shape = m[0], list(m[1])
            out = onnx.helper.make_model(self.exporter.graph_proto(order, inputs, outputs))
        finally:
            for name, (dtype, shape) in saved.items():
                tensors[name].dtype, tensors[name].shape = dtype, shape
        out = self._restore_model_fields(out)
        renamed = self.renamed(units)
        if renamed:
            _output_under(out, renamed)
        if self.folded_boundary:
            _inputs_to_initializers(out, self._values_of([n for n in inputs if n not in self.graph_inputs]))
        if self.keep_constant_nodes or not self._constant_flags()[0][order].any():
            return out  # no Constant node to turn into an initializer (a scan of every node spared)
        return constants_to_initializers(out, in_place=True)

    def _restore_model_fields(self, out: onnx.ModelProto) -> onnx.ModelProto:
        src = self.model
        out.ir_version = src.ir_version
        del out.opset_import[:]
        out.opset_import.extend(src.opset_import)
        out.producer_name, out.producer_version = src.producer_name, src.producer_version
        out.domain, out.model_version, out.doc_string = src.domain, src.model_version, src.doc_string
        del out.metadata_props[:]
        out.metadata_props.extend(src.metadata_props)
        del out.functions[:]
        out.functions.extend(src.functions)
        return out

    def describe(self, units: Iterable[int]) -> List[Dict[str, str]]:
        """Name and op type of each unit, in topological order."""
        return [{"name": self.nodes[i].name, "op": self.nodes[i].op} for i in sorted(units)]

    def count_nodes(self, units: Iterable[int]) -> int:
        """Number of nodes in the model ``extract(units)`` returns."""
        return self.node_count(self.boundary(units)[0])

    def node_count(self, order: Iterable[int]) -> int:
        """Number of nodes ``extract`` writes for the node indices ``order`` (``boundary()[0]``)."""
        order = list(order)
        if self.keep_constant_nodes:
            return len(order)
        return len(order) - int(self._constant_flags()[1][order].sum())

    def _constant_flags(self) -> Tuple[np.ndarray, np.ndarray]:
        """Per node: a Constant node; a plain one (its ``value`` alone), which is written as an initializer."""
        if self._constant is None:
            self._constant = (
                np.array([n.op == "Constant" for n in self.nodes], bool),
                np.array([n.op == "Constant" and set(n.attrs) == {"value"} for n in self.nodes], bool),
            )
        return self._constant

    def find(self, name: str) -> Optional[int]:
        """Index of the node called ``name``, or None."""
        for i, n in enumerate(self.nodes):
            if n.name == name:
                return i
        return None
