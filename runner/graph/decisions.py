"""Graph outputs whose shape depends on the data: the decisions of a model (NMS, top-k, argwhere).

A detector's boxes after NonMaxSuppression, a NonZero's indices, a Compress: how many rows such an
output has is decided by comparing values with a threshold, so the tiniest difference can add or
drop a row, and the array then cannot be compared element by element. Found once at load: a graph
output whose shape ONNX shape inference leaves symbolic given the input shapes of the run's
samples, traced back to where shapes stop being fixed; the tensors that feed that point are the ones
to compare instead (``checker.outputs``), or a detection comparison judges the end result
(``checker.detections``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Set

import onnx
from onnx import TensorProto

from runner.graph.stubs import weightless

#: ops whose output shape depends on the values of their inputs (TopK: when k is computed)
DECISION_OPS = frozenset({"NonMaxSuppression", "NonZero", "Compress", "Unique", "TopK"})
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


@dataclass(frozen=True)
class Decision:
    """What makes a graph output's shape depend on the data.

    Attributes:
        node: the decision node's name. op: its op type.
        inputs: its float inputs (e.g. NMS's boxes and scores): tensors of fixed shape to compare.
    """

    node: str
    op: str
    inputs: List[str]

    def hint(self) -> str:
        """One line: what decides the shape and what to compare instead."""
        compare = f"checker.outputs=[{','.join(self.inputs)}]" if self.inputs else "checker.outputs=[...]"
        return (
            f"its length is decided by {self.op} {self.node}: compare the tensors before it ({compare}) "
            "or the detections (checker.detections=...)"
        )


def _is_fixed(vi: Optional[onnx.ValueInfoProto]) -> bool:
    if vi is None:
        return False
    tt = vi.type.tensor_type
    return tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


def _constants(model: onnx.ModelProto) -> Set[str]:
    """Initializers and the outputs of Constant nodes (and of nodes fed by constants only)."""
    known = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" or (node.input and all(i in known for i in node.input if i)):
            known.update(o for o in node.output if o)
    return known


def _is_decision(node: onnx.NodeProto, constants: Set[str]) -> bool:
    if node.op_type == "TopK":
        return len(node.input) > 1 and node.input[1] not in constants
    return node.op_type in DECISION_OPS


#: ops that only reshape or retype a decision's indices on their way to the node that uses them
PLUMBING = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Cast", "Slice", "Flatten", "Identity", "Concat"})


def _index_readers(decision: onnx.NodeProto, readers: Mapping[str, List[onnx.NodeProto]]) -> List[onnx.NodeProto]:
    """The nodes that use a decision's outputs (its kept indices), past ops that only reshape them:
    the GatherND that picks the kept boxes' rows."""
    found: List[onnx.NodeProto] = []
    frontier, seen = [o for o in decision.output if o], set()
    for _ in range(4):
        following: List[str] = []
        for name in frontier:
            for reader in readers.get(name, []):
                if reader.name in seen:
                    continue
                seen.add(reader.name)
                if reader.op_type in PLUMBING:
                    following.extend(o for o in reader.output if o)
                else:
                    found.append(reader)
        frontier = following
    return found


def data_dependent_outputs(
    model: onnx.ModelProto, input_shapes: Optional[Mapping[str, Sequence[int]]] = None
) -> Dict[str, Decision]:
    """``{graph output: its Decision}`` for each output of data-dependent shape (module docstring).

    An output is data-dependent when its shape is not fixed once the input shapes are (ONNX shape
    inference with ``input_shapes``) and a decision op (``DECISION_OPS``, TopK with a computed k) is
    upstream of it. The decision named is the earliest of them (no other decision before it: a
    score threshold's NonZero); the tensors to compare are the float tensors that reach the decisions
    without passing one: a decision's float inputs, the float inputs of the node making a non-float
    one (the scores a Greater thresholds), and the other float inputs of the nodes that read a
    decision (the boxes a GatherND picks rows of).

    Args:
        model: the model (not modified; inference runs on its graph without weight values).
        input_shapes: concrete shapes of the graph inputs (the run's samples).
    """
    bare, _ = weightless(model)
    for vi in bare.graph.input:
        shape = (input_shapes or {}).get(vi.name)
        if shape is not None:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in shape:
                dims.add().dim_value = int(d)
    try:
        typed = onnx.shape_inference.infer_shapes(bare, strict_mode=False, data_prop=True)
    except Exception:  # inference cannot run: only what the outputs declare
        typed = bare
    infos = {v.name: v for v in list(typed.graph.value_info) + list(typed.graph.output) + list(typed.graph.input)}
    types = {n: v.type.tensor_type.elem_type for n, v in infos.items()}
    types.update({i.name: i.data_type for i in model.graph.initializer})
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output if o}
    constants = _constants(model)
    tainted: Set[str] = set()  # tensors a decision reaches
    for node in nodes:  # topological order
        if _is_decision(node, constants) or any(i in tainted for i in node.input):
            tainted.update(o for o in node.output if o)
    readers: Dict[str, List[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def floats_before(name: str) -> List[str]:
        if name in constants or name in tainted:
            return []
        if types.get(name) in _FLOATS:
            return [name]
        up = producer.get(name)
        return [i for i in up.input if i and i not in constants and types.get(i) in _FLOATS] if up else []

    found: Dict[str, Decision] = {}
    for out in model.graph.output:
        if _is_fixed(infos.get(out.name, out)) or out.name not in tainted:
            continue
        seen: Set[str] = set()
        stack, earliest = [out.name], []
        while stack:
            node = producer.get(stack.pop())
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            if _is_decision(node, constants) and not any(i in tainted for i in node.input):
                earliest.append(node)
                continue
            stack.extend(i for i in node.input if i in tainted)
        if not earliest:
            continue
        compare: List[str] = []
        for node in earliest:
            for name in node.input:
                compare.extend(floats_before(name))
            for reader in _index_readers(node, readers):
                for name in reader.input:
                    compare.extend(floats_before(name))
        first = earliest[0]
        found[out.name] = Decision(first.name, first.op_type, list(dict.fromkeys(compare)))
    return found
