"""The structure of a QDQ (QuantizeLinear/DequantizeLinear) model, read from its graph.

A QDQ model computes in float between explicit quantization points: a float tensor ``t`` goes
through ``QuantizeLinear`` to int8 and back through ``DequantizeLinear``, and the node that reads
the DequantizeLinear's output computes on the rounded value. TensorRT (strongly typed) fuses such a
node and its Q/DQ into an int8 kernel; ONNX Runtime runs them as written. A weight is stored int8
and read through a DequantizeLinear alone.

So the float tensor before a QuantizeLinear and the tensor after its DequantizeLinear hold the same
value, up to the rounding: ``qdq_aliases`` matches a QDQ model's tensors with its float original's
by that, and ``input_chains`` gives, for each tensor a DequantizeLinear makes, the Q/DQ nodes that
make it from a float tensor (or from an int8 weight), so a node can be run alone with its own
quantization of its inputs (``runner.graph.isolate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import onnx

#: the op types of quantization points (ONNX's and ONNX Runtime's contrib domain alike)
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def is_qdq(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a QuantizeLinear or DequantizeLinear."""
    return node.op_type in QDQ_OPS


def has_qdq(model: onnx.ModelProto) -> bool:
    """Whether the top-level graph holds any QuantizeLinear or DequantizeLinear node."""
    return any(is_qdq(n) for n in model.graph.node)


def compute_nodes(model: onnx.ModelProto) -> List[onnx.NodeProto]:
    """The top-level nodes that compute: neither Constant nor a quantization point."""
    return [n for n in model.graph.node if n.op_type != "Constant" and not is_qdq(n)]


@dataclass(frozen=True)
class Chain:
    """How a DequantizeLinear's output is made.

    Attributes:
        source: the float activation quantized (the QuantizeLinear's input), or None for a weight
            stored quantized (the DequantizeLinear reads an initializer).
        nodes: the QuantizeLinear (when there is one) and the DequantizeLinear, in graph order.
    """

    source: Optional[str]
    nodes: Tuple[onnx.NodeProto, ...]


def input_chains(model: onnx.ModelProto) -> Dict[str, Chain]:
    """``{DequantizeLinear output: Chain}`` for every DequantizeLinear of the top-level graph.

    A DequantizeLinear fed by a QuantizeLinear is an activation's Q/DQ pair (source: the
    QuantizeLinear's input); one fed by anything else (an int8 initializer, a Constant) is a
    quantized weight (source None).
    """
    producer = {o: n for n in model.graph.node for o in n.output if o}
    chains: Dict[str, Chain] = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        q = producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            chains[node.output[0]] = Chain(q.input[0], (q, node))
        else:
            chains[node.output[0]] = Chain(None, (node,))
    return chains


def qdq_aliases(model: onnx.ModelProto, known: Set[str], chains: Optional[Dict[str, Chain]] = None) -> Dict[str, str]:
    """For tensors of a QDQ ``model`` that a float original (its tensors ``known``) does not have,
    the original tensor holding the same value before rounding.

    - A DequantizeLinear's output is its QuantizeLinear's input (followed back through Q/DQ pairs
      in a row).
    - A tensor quantized on its way to a graph output is renamed by ONNX Runtime's quantizer
      (``y_QuantizeLinear_Input`` -> Q -> DQ -> ``y``): the QuantizeLinear's input is the
      DequantizeLinear's output.

    Args:
        model: the QDQ model.
        known: the tensor names of the float original.
        chains: ``input_chains(model)`` when the caller has it already.

    Returns:
        ``{QDQ model's tensor: original tensor}``, for tensors not in ``known`` only.
    """
    chains = input_chains(model) if chains is None else chains
    alias: Dict[str, str] = {}
    for out, chain in chains.items():
        if out in known or chain.source is None:
            continue
        source: Optional[str] = chain.source
        seen = {out}
        while source is not None and source not in known and source in chains and source not in seen:
            seen.add(source)
            source = chains[source].source
        if source is not None and source in known:
            alias[out] = source
    for out, chain in chains.items():
        if out in known and chain.source is not None and chain.source not in known:
            alias[chain.source] = out
    return alias


def quantized_nodes(model: onnx.ModelProto) -> Set[str]:
    """The names of the compute nodes that read a DequantizeLinear's output: the nodes the model runs
    quantized."""
    made = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {node.name for node in compute_nodes(model) if any(name in made for name in node.input)}
