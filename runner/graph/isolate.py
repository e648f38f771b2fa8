"""Models in which every node runs alone: each node's activations come in as graph inputs.

The error a node *introduces* is what it makes of exact inputs: run alone on the target backend,
fed the reference values of its inputs, compared with the reference values of its outputs. One
session per node would cost a session per node; instead one model holds many nodes, each
reading its activations from its own graph inputs (``<tensor>::ref``) instead of from the node
that produced them, so one run gives every node's introduced error. Weights (initializers and
Constant nodes) stay wired: a node's own weights in the target precision are part of what it
introduces.

Nodes with subgraphs (If, Loop, Scan) read outer-scope tensors by name, which cannot be renamed
from outside; ``isolated_groups`` puts them in models of their own in which none of them reads
another's output.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set

import onnx
from onnx import helper

from runner.graph.qdq import Chain

#: the suffix of the graph input that feeds a node the reference value of a tensor
REF_SUFFIX = "::ref"


def bodies(node: onnx.NodeProto) -> List[onnx.GraphProto]:
    """The graphs a node holds: If branches, Loop and Scan bodies."""
    return [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH] + [
        g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs
    ]


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every body its nodes hold (If, Loop, Scan), nested ones too, depth first."""
    yield graph
    for node in graph.node:
        for body in bodies(node):
            yield from all_graphs(body)


def has_body(node: onnx.NodeProto) -> bool:
    """Whether a node holds a graph (If, Loop, Scan)."""
    return any(a.type in _BODY_TYPES for a in node.attribute)


_BODY_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def outer_scope_inputs(node: onnx.NodeProto) -> List[str]:
    """The tensors a node's bodies (If branches, Loop/Scan bodies, nested) read from enclosing scopes, sorted."""
    reads: Set[str] = set()

    def walk(graph: onnx.GraphProto, known: Set[str]) -> None:
        local = known | {i.name for i in graph.input} | {i.name for i in graph.initializer}
        for n in graph.node:
            for name in n.input:
                if name and name not in local:
                    reads.add(name)
            for body in bodies(n):
                walk(body, local)
            local |= set(n.output)

    for body in bodies(node):
        walk(body, set())
    return sorted(reads)


def outer_reads(graph: onnx.GraphProto) -> Set[str]:
    """The tensors of ``graph`` that the bodies of its nodes read (``outer_scope_inputs`` of each)."""
    return {name for node in graph.node if has_body(node) for name in outer_scope_inputs(node)}


def weight_names(model: onnx.ModelProto) -> Set[str]:
    """Initializers and Constant node outputs of the top-level graph: the tensors that stay wired."""
    names = {i.name for i in model.graph.initializer}
    names.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    return names


def isolated_groups(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> List[List[onnx.NodeProto]]:
    """Split ``nodes`` (Constant nodes left out) into groups that ``isolated_model`` can hold: every
    node without a subgraph in the first group; nodes with subgraphs in further groups in which no
    node reads (explicitly or from a body) an output of another node of the group.

    Returns:
        The groups, each in the order of ``nodes``; empty groups are left out.
    """
    plain = [n for n in nodes if n.op_type != "Constant" and not has_body(n)]
    nested = [n for n in nodes if n.op_type != "Constant" and has_body(n)]
    groups: List[List[onnx.NodeProto]] = [plain] if plain else []
    while nested:
        produced: Set[str] = set()
        group, rest = [], []
        for node in nested:
            reads = set(node.input) | set(outer_scope_inputs(node))
            if reads & produced:
                rest.append(node)
            else:
                group.append(node)
                produced.update(node.output)
        groups.append(group)
        nested = rest
    return groups


def isolated_model(
    model: onnx.ModelProto,
    nodes: Iterable[onnx.NodeProto],
    types: Mapping[str, int],
    weights: Optional[Set[str]] = None,
    chains: Optional[Mapping[str, Chain]] = None,
) -> onnx.ModelProto:
    """One model in which each of ``nodes`` reads its activations from graph inputs.

    Args:
        model: the model the nodes come from (its initializers, Constant nodes, opsets).
        nodes: the nodes to isolate (one group of ``isolated_groups``; no Q/DQ nodes).
        types: ``{tensor name: ONNX elem type}`` of the model's tensors, for the new graph inputs.
        weights: tensor names that stay wired (``weight_names``); computed when None.
        chains: a QDQ model's ``runner.graph.qdq.input_chains``: a plain node that reads a
            DequantizeLinear's output gets a copy of the Q/DQ nodes that make it, the QuantizeLinear
            fed the reference value of the float tensor it quantizes (a quantized weight's
            DequantizeLinear stays wired): the node runs alone with its own quantization.

    Returns:
        A model whose graph inputs are ``<tensor>`` + ``REF_SUFFIX`` for each activation a plain node
        reads (the tensor's own name for a node with a subgraph; the float tensor a copied Q/DQ
        pair quantizes), and whose graph outputs are every output of the nodes, under their own
        names, then the output of each copied DequantizeLinear. Constant nodes the nodes read are
        copied in.

    Raises:
        KeyError: an activation with no entry in ``types``.
    """
    weights = weight_names(model) if weights is None else weights
    chains = chains or {}
    constants = {o: n for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    used_consts: Dict[str, onnx.NodeProto] = {}
    inputs: Dict[str, onnx.ValueInfoProto] = {}
    chain_nodes: Dict[str, List[onnx.NodeProto]] = {}
    out_nodes: List[onnx.NodeProto] = []
    outputs: List[str] = []

    def feed(name: str, fed: str) -> None:
        if fed not in inputs:
            inputs[fed] = helper.make_tensor_value_info(fed, types[name], None)

    def wire(name: str) -> str:
        """The name a plain node reads ``name`` by in the isolated model."""
        if name in weights:
            if name in constants:
                used_consts[name] = constants[name]
            return name
        chain = chains.get(name)
        if chain is None:
            feed(name, name + REF_SUFFIX)
            return name + REF_SUFFIX
        if name not in chain_nodes:
            copies = []
            for k, original in enumerate(chain.nodes):
                c = onnx.NodeProto()
                c.CopyFrom(original)
                if k == 0 and chain.source is not None:
                    c.input[0] = wire(chain.source)
                for extra in list(c.input)[1 if k == 0 and chain.source is not None else 0 :]:
                    if extra in constants:
                        used_consts[extra] = constants[extra]
                copies.append(c)
            chain_nodes[name] = copies
        return name

    for node in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        nested = has_body(node)
        if nested:
            for name in list(node.input) + outer_scope_inputs(node):
                if name and name in weights:
                    wire(name)
                elif name:
                    feed(name, name)
        else:
            del copy.input[:]
            copy.input.extend("" if not n else wire(n) for n in node.input)
        out_nodes.append(copy)
        outputs.extend(o for o in node.output if o)
    pairs = [c for copies in chain_nodes.values() for c in copies]
    outputs.extend(chain_nodes)
    used_inits = {n for node in out_nodes + pairs for n in node.input} | {
        n for node in out_nodes if has_body(node) for n in outer_scope_inputs(node)
    }
    graph = helper.make_graph(
        list(used_consts.values()) + pairs + out_nodes,
        f"{model.graph.name}_isolated",
        list(inputs.values()),
        [onnx.ValueInfoProto(name=o) for o in outputs],
        [i for i in model.graph.initializer if i.name in used_inits],
    )
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    out.functions.extend(model.functions)
    return out
