"""Repairs of what ONNX Runtime's float16 converter writes, so that kept nodes really stay fp32.

Each function edits a converted model in place (``runner.lowp.convert.Converter`` calls them in
order): kept nodes get fp32 copies of weights they share with converted nodes, duplicate Casts
an older converter wrote go, Casts the
converter appended for nodes inside If bodies move into those bodies, fp32 -> fp16 -> fp32 round
trips are bypassed, weights keep the type exporters declared for them, and for bf16 every fp16
type becomes bf16 with weights made again from their fp32 values.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Set

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runner.graph.isolate import bodies, has_body, outer_reads, outer_scope_inputs
from runner.lowp.precisions import LOW_TYPES


def fp32_copies_for_kept(model: onnx.ModelProto, kept: FrozenSet[str], blocked_ops: Set[str]) -> Dict[str, str]:
    """Give kept nodes their own fp32 copy of each float weight a converted node also reads, in place
    (the converter would convert a shared weight once and feed kept nodes its rounded values).

    Returns:
        ``{copy's name: the weight it copies}``.
    """
    g = model.graph
    floats = {i.name: i for i in g.initializer if i.data_type == TensorProto.FLOAT}
    if not floats:
        return {}
    stays = [n.name in kept or n.op_type in blocked_ops for n in g.node]
    readers: Dict[str, Set[bool]] = {}
    for node, fp32 in zip(g.node, stays):
        for name in node.input:
            if name in floats:
                readers.setdefault(name, set()).add(fp32)
    shared = {name for name, kinds in readers.items() if kinds == {True, False}}
    taken = {i.name for i in g.initializer} | {o for n in g.node for o in n.output} | {i.name for i in g.input}
    copies: Dict[str, str] = {}
    for name in sorted(shared):
        copy_name = f"{name}_fp32"
        while copy_name in taken:
            copy_name += "_"
        taken.add(copy_name)
        copy = TensorProto()
        copy.CopyFrom(floats[name])
        copy.name = copy_name
        g.initializer.append(copy)
        copies[name] = copy_name
    for node, fp32 in zip(g.node, stays):
        if fp32:
            for i, name in enumerate(node.input):
                if name in copies:
                    node.input[i] = copies[name]
    return {copy: name for name, copy in copies.items()}


def bypass_round_trips(model: onnx.ModelProto) -> int:
    """Bypass ``fp32 -> Cast(low) -> Cast(fp32)`` chains of the top-level graph in place; return how
    many were bypassed.

    Consumers of the second Cast read the fp32 tensor directly; a second Cast that is a graph
    output reads the fp32 tensor itself (a Cast to the type it has: no rounding). Casts left
    without readers are removed. Types come from the model's declarations (the converter declares
    every tensor it touches); a tensor read inside a body is never rewired.
    """
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.value_info)}
    types.update({i.name: i.data_type for i in g.initializer})
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    inner = outer_reads(g)

    def cast_to(node: onnx.NodeProto) -> int:
        return next((a.i for a in node.attribute if a.name == "to"), TensorProto.UNDEFINED)

    replace: Dict[str, str] = {}
    bypassed = 0
    for node in g.node:
        if node.op_type != "Cast" or cast_to(node) != TensorProto.FLOAT:
            continue
        first = producer.get(node.input[0])
        if first is None or first.op_type != "Cast" or cast_to(first) not in LOW_TYPES:
            continue
        source = first.input[0]
        if types.get(source) != TensorProto.FLOAT:
            continue
        if node.output[0] in outputs:
            node.input[0] = source
            bypassed += 1
        elif node.output[0] not in inner:
            replace[node.output[0]] = source
            bypassed += 1
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in replace:
                node.input[i] = replace[name]
    while True:  # drop Casts nobody reads any more
        used = {i for n in g.node for i in n.input} | outputs | inner
        nodes = list(g.node)
        alive = [n for n in nodes if n.op_type != "Cast" or n.output[0] in used]
        if len(alive) == len(nodes):
            return bypassed
        del g.node[:]  # one rebuild: removing each dead Cast compared it with every node before it
        g.node.extend(alive)


def drop_identity_casts(model: onnx.ModelProto) -> int:
    """Remove top-level Casts to the type their input already has (fp32 to fp32: what the converter leaves
    around nodes it keeps, on weights and graph outputs), in place; return how many went. With every node
    kept the candidate is then the model as given, node for node: an identity Cast changes no value but can
    change ONNX Runtime's kernel choice (measured on a decoder: 68 of them). Readers of a dropped Cast read its
    input; a Cast that writes a graph output gives that name to the node that makes its input instead, when
    nothing else reads it and it is no graph input, initializer or output itself. Types come from the model's
    declarations; a tensor read inside a body is never rewired."""
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.value_info) + list(g.output)}
    types.update({i.name: i.data_type for i in g.initializer})
    outputs = {o.name for o in g.output}
    fixed = outputs | {i.name for i in g.input} | {i.name for i in g.initializer}
    inner = outer_reads(g)
    readers: Dict[str, int] = {}
    for node in g.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    producer = {o: n for n in g.node for o in n.output}
    replace: Dict[str, str] = {}
    renamed: Set[str] = set()
    dropped: Set[int] = set()
    for index, node in enumerate(g.node):
        if node.op_type != "Cast" or not node.input or node.input[0] not in types:
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), TensorProto.UNDEFINED)
        source, target = node.input[0], node.output[0]
        if types[source] != to or target in inner or source in replace:
            continue
        if target not in outputs:
            replace[target] = source
            dropped.add(index)
        elif source not in fixed and source not in inner and readers.get(source) == 1 and source in producer:
            made = producer[source]
            made.output[list(made.output).index(source)] = target
            renamed.add(source)
            dropped.add(index)
    for node in g.node:
        for i, name in enumerate(node.input):
            while name in replace:
                name = replace[name]
            node.input[i] = name
    if dropped:
        alive = [n for i, n in enumerate(g.node) if i not in dropped]
        del g.node[:]
        g.node.extend(alive)
        gone = set(replace) | renamed
        kept_info = [v for v in g.value_info if v.name not in gone]
        del g.value_info[:]
        g.value_info.extend(kept_info)
    return len(dropped)


def fp32_reads_in_kept_bodies(model: onnx.ModelProto, kept: FrozenSet[str]) -> int:
    """Make the bodies of kept If/Loop/Scan nodes read the fp32 tensors of the outer graph, in place;
    return how many names were rewired.

    The converter keeps a kept node's body fp32 (its nodes are blocked too), but casts only a node's
    inputs, not what its bodies read from outside: an outer tensor the body reads is the low-typed
    one (silero VAD's decoder If: its Squeeze read an fp16 Relu output, an invalid model). Each
    low-typed outer read of a kept body is made fp32: a ``Cast(to=low)`` of a float tensor is looked
    through (the body reads the Cast's input); any other gets a ``Cast(to=float)`` before the node.
    """
    g = model.graph
    if not any(node.name in kept and has_body(node) for node in g.node):
        return 0  # no kept node holds a body (most models)
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.value_info) + list(g.output)}
    types.update({i.name: i.data_type for i in g.initializer})
    casts: Dict[str, str] = {}
    for node in g.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type == "Cast" and to is not None:
            types.setdefault(node.output[0], to)
    for node in g.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type == "Cast" and to in LOW_TYPES and types.get(node.input[0]) == TensorProto.FLOAT:
            casts[node.output[0]] = node.input[0]
    rewired = 0
    nodes: List[onnx.NodeProto] = []
    for node in g.node:
        if node.name in kept and bodies(node):
            renames: Dict[str, str] = {}
            for name in outer_scope_inputs(node):
                if types.get(name) not in LOW_TYPES:
                    continue
                if name in casts:
                    renames[name] = casts[name]
                else:
                    wide = f"{name}_fp32_for_{node.name}"
                    nodes.append(helper.make_node("Cast", [name], [wide], name=f"{wide}_cast", to=TensorProto.FLOAT))
                    renames[name] = wide
            for body in bodies(node):
                rewired += _rename_outer(body, renames, set())
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    return rewired


def _rename_outer(graph: onnx.GraphProto, renames: Dict[str, str], shadowed: Set[str]) -> int:
    """Rename reads of outer tensors in ``graph`` (and its bodies) by ``renames``, except names the graph
    or an enclosing body defines itself."""
    local = shadowed | {i.name for i in graph.input} | {i.name for i in graph.initializer}
    local |= {o for n in graph.node for o in n.output}
    count = 0
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames and name not in local:
                node.input[i] = renames[name]
                count += 1
        for body in bodies(node):
            count += _rename_outer(body, renames, local)
    for out in graph.output:  # a body output that is an outer tensor itself
        if out.name in renames and out.name not in local:
            out.name = renames[out.name]
            count += 1
    return count


def drop_duplicate_casts(graph: onnx.GraphProto) -> int:
    """Remove the second and later of identical Cast nodes (same input, output, name and target
    type), in place; return how many went. ONNX Runtime's float16 converter before 1.32 gives each
    reader of a tensor kept in fp32 its own ``<tensor>_cast_to_fp32`` Cast, all writing the same
    name: a graph no longer in SSA form (seen on the detector with onnxruntime-gpu 1.31.1)."""
    seen: Set[bytes] = set()
    dropped = [i for i, n in enumerate(graph.node) if n.op_type == "Cast" and _seen_before(n, seen)]
    for index in reversed(dropped):  # by position: remove() would take the first of the equal nodes
        del graph.node[index]
    return len(dropped)


def _seen_before(node: onnx.NodeProto, seen: Set[bytes]) -> bool:
    key = node.SerializeToString(deterministic=True)
    if key in seen:
        return True
    seen.add(key)
    return False


def home_stray_casts(model: onnx.ModelProto) -> int:
    """Move top-level Casts that read a tensor made inside a body (If/Loop/Scan) into that body, in
    place; return how many moved. The converter appends the Casts around a node it keeps in fp32 to
    the top-level graph, also when the node lives in a body (an op on its block list inside an If)."""
    home: Dict[str, onnx.GraphProto] = {}

    def index(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for body in bodies(node):
                for inner in body.node:
                    for out in inner.output:
                        home[out] = body
                home.update({i.name: body for i in body.input})
                index(body)

    index(model.graph)
    top = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    top |= {i.name for i in model.graph.initializer}
    moved = [n for n in model.graph.node if n.op_type == "Cast" and n.input[0] not in top and n.input[0] in home]
    for cast in moved:
        model.graph.node.remove(cast)
        home[cast.input[0]].node.append(cast)
        home[cast.output[0]] = home[cast.input[0]]
    return len(moved)


def declare_weights_as_stored(graph: onnx.GraphProto) -> None:
    """Make ``value_info`` entries of initializers (exporters declare them) give the type the
    initializer has, in place: the converter retypes every declared float tensor, also weights
    it leaves fp32 because only kept nodes read them."""
    stored = {i.name: i.data_type for i in graph.initializer}
    for vi in graph.value_info:
        if vi.name in stored and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.elem_type = stored[vi.name]


def _bf16_tensor(values: np.ndarray, name: str) -> TensorProto:
    """fp32 values as a bfloat16 TensorProto, rounded to nearest even."""
    u32 = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    bits = (u32 + 0x7FFF + ((u32 >> 16) & 1)) >> 16
    t = TensorProto(name=name, data_type=TensorProto.BFLOAT16, dims=list(values.shape))
    t.raw_data = bits.astype(np.uint16).tobytes()
    return t


def retype_bf16(converted: onnx.ModelProto, original: onnx.ModelProto, stubs: FrozenSet[str] = frozenset()) -> None:
    """Turn every fp16 type of ``converted`` into bf16, taking values from ``original``'s fp32 data;
    the top-level weights named in ``stubs`` hold no values (``runner.graph.stubs``) and are retyped only."""
    originals = {t.name: t for t in original.graph.initializer}

    def fp32_values(init: TensorProto) -> np.ndarray:
        source = originals.get(init.name)
        if source is not None and source.data_type == TensorProto.FLOAT:
            return numpy_helper.to_array(source)
        return numpy_helper.to_array(init).astype(np.float32)

    def fix_graph(g: onnx.GraphProto) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
                vi.type.tensor_type.elem_type = TensorProto.BFLOAT16
        for i, init in enumerate(g.initializer):
            if init.data_type == TensorProto.FLOAT16 and g is converted.graph and init.name in stubs:
                init.data_type = TensorProto.BFLOAT16
            elif init.data_type == TensorProto.FLOAT16:
                g.initializer[i].CopyFrom(_bf16_tensor(fp32_values(init), init.name))
        for node in g.node:
            for attr in node.attribute:
                if (
                    attr.name in ("to", "dtype")
                    and attr.type == onnx.AttributeProto.INT
                    and attr.i == TensorProto.FLOAT16
                ):
                    attr.i = TensorProto.BFLOAT16
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                    attr.t.CopyFrom(_bf16_tensor(numpy_helper.to_array(attr.t).astype(np.float32), attr.t.name))
                if attr.type == onnx.AttributeProto.GRAPH:
                    fix_graph(attr.g)
                for sub in attr.graphs:
                    fix_graph(sub)

    fix_graph(converted.graph)
