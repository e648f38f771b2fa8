"""Reading a QDQ model another tool made (``quantized_model=``) against ``model=``: which low precision it is in,
and for each of ``model=``'s nodes the Q/DQ chains and changed initializers the quantized model gives it
(``read_given``), for ``runner.lowp.given_qdq.GivenQuantizer`` to build candidates from.

The two models are matched node by node: by name where the quantized model keeps ``model=``'s names, else by
position in topological order with the same op types; tensors follow the matched nodes' inputs and outputs.
A model that does not match (another model, a float model, one whose tool fused or removed nodes) is refused
with the first difference named.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import onnx
from onnx import TensorProto

from runner.errors import ConfigError
from runner.graph.constants import constant_tensor
from runner.graph.qdq import Chain, compute_nodes, input_chains, is_qdq
from runner.graph.stubs import raw_bytes
from runner.lowp.precisions import FLOAT8, INT8, LowPrecision

#: the element types a quantized tensor of a given model may have, and the low precision each means (int32: a bias
#: ONNX Runtime's quantizer stores with the product of its input's and weight's scales)
QUANTIZED_TYPES = {
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "int8",
    TensorProto.INT32: "int8",
    TensorProto.FLOAT8E4M3FN: "float8",
}


log = logging.getLogger(__name__)


@dataclass
class Recipe:
    """What one input of one node reads in the quantized model.

    Attributes:
        chain: the Q/DQ chain that makes it (None: an initializer the tool changed, ``init``).
        init: the initializer read there, as the tool wrote it (a chain's fake-quantized weight, or a
            changed bias); None for an activation's chain or a stored quantized weight.
    """

    chain: Optional[Chain] = None
    init: Optional[TensorProto] = None


@dataclass
class Given:
    """The quantized model read against ``model=``.

    Attributes:
        recipes: ``{model= node name: {input position: Recipe}}``.
        outputs: ``{model= node name: {output position: the chain its output takes to a graph output}}``.
        units: ``model=``'s node names that read a DequantizeLinear (the nodes a search may take out of int8).
        consts: ``{name: tensor}`` of what the chains read (scales, zero points, stored values), from the
            quantized model's initializers and Constant nodes.
        quantized_type: the element type of its quantized tensors (``QUANTIZED_TYPES``).
        opset: the quantized model's default-domain opset.
    """

    recipes: Dict[str, Dict[int, Recipe]] = field(default_factory=dict)
    outputs: Dict[str, Dict[int, Chain]] = field(default_factory=dict)
    units: List[str] = field(default_factory=list)
    consts: Dict[str, TensorProto] = field(default_factory=dict)
    quantized_type: int = TensorProto.INT8
    opset: int = 13


def load_given(path: str, option: str = "quantized_model") -> onnx.ModelProto:
    """The quantized model named by ``option`` (its external data included).

    Raises:
        ModelError: a missing, truncated or non-ONNX file (one line naming ``option``).
        ConfigError: a model with no Q/DQ (a float model).
    """
    from runner.graph.load import load_model

    model = load_model(path, option)
    if not input_chains(model):
        raise ConfigError(f"{option}={path} {no_qdq(model)}")
    return model


#: ONNX Runtime's quantized operators (QOperator format, and quantize_dynamic's): a model of them has no Q/DQ pairs
QOPERATORS = frozenset(
    {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul", "QGemm", "QAttention",
     "DynamicQuantizeMatMul", "QLinearAdd", "QLinearMul"}
)  # fmt: skip


def no_qdq(model: onnx.ModelProto) -> str:
    """What a model without Q/DQ pairs is, and what to give instead: one of ONNX Runtime's QOperator or dynamic
    models (named by the ops that show it), else a float model."""
    ops = sorted({n.op_type for n in model.graph.node if n.op_type in QOPERATORS})
    if ops:
        dynamic = "DynamicQuantizeLinear" in ops
        return (
            f"holds {', '.join(ops)}: ONNX Runtime's {'quantize_dynamic' if dynamic else 'QOperator'} format, whose "
            "integer ops hide the float nodes they replaced; give a QDQ model (quantize_static(..., "
            "quant_format=QuantFormat.QDQ), ModelOpt, NNCF)"
        )
    return (
        "holds no QuantizeLinear/DequantizeLinear: it is a float model; give the QDQ model a quantizer made from "
        "model= (ModelOpt, NNCF, ONNX Runtime's quantize_static)"
    )


def given_precision(model: onnx.ModelProto) -> LowPrecision:
    """The low precision a quantized model's Q/DQ hold: float8 where any quantizes to float8e4m3fn, else int8."""
    consts = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        made = constant_tensor(node)
        if made is not None:
            consts[made.name] = made
    types = {_quantized_type(c, consts) for c in input_chains(model).values()}
    return FLOAT8 if TensorProto.FLOAT8E4M3FN in types else INT8


def opset_of(model: onnx.ModelProto) -> int:
    """A model's default-domain opset (0 when it imports none)."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def read_given(model: onnx.ModelProto, quantized: onnx.ModelProto, option: str = "quantized_model") -> Given:
    """Match ``quantized`` to ``model`` node by node and say what it changes at each node.

    Args:
        model: ``model=`` prepared (nodes named, Constant nodes as initializers, opset raised).
        quantized: the QDQ model as loaded.
        option: the key that named it, for messages.

    Returns:
        The ``Given`` reading.

    Raises:
        ConfigError: no Q/DQ at all; a quantized type this tool does not know; the compute nodes differ in
            number, op type or wiring (the first difference named); a Q/DQ chain that makes a tensor no
            matched node reads.
    """
    chains = input_chains(quantized)
    if not chains:
        raise ConfigError(f"{option}= {no_qdq(quantized)}")
    consts: Dict[str, TensorProto] = {i.name: i for i in quantized.graph.initializer}
    for node in quantized.graph.node:
        made = constant_tensor(node)
        if made is not None:
            consts[made.name] = made
    types = {t for t in (_quantized_type(c, consts) for c in chains.values()) if t is not None}
    unknown = [t for t in types if t not in QUANTIZED_TYPES]
    if unknown or not types:
        names = ", ".join(TensorProto.DataType.Name(t) for t in unknown) or "none"
        raise ConfigError(
            f"{option}= quantizes to {names}; this tool reads int8, uint8 and float8e4m3fn Q/DQ models (int32 biases)"
        )
    pairs, removed = _matched(model, quantized, option)
    if removed:
        said_removed(model, removed, option)

    def same(f_in: str, q_in: Optional[str]) -> bool:
        """Whether the quantized model's tensor (mapped to ``model=``'s) is ``f_in``, through removed activations."""
        while f_in in removed and f_in != q_in:
            f_in = removed[f_in]
        return q_in == f_in

    fp8 = TensorProto.FLOAT8E4M3FN in types
    given = Given(
        consts=consts, quantized_type=TensorProto.FLOAT8E4M3FN if fp8 else min(types), opset=opset_of(quantized)
    )
    f_inits = {i.name: i for i in model.graph.initializer}
    tensor = {i.name: i.name for i in quantized.graph.input}  # quantized model's tensor -> model='s
    f_inputs = [i.name for i in model.graph.input if i.name not in f_inits]
    q_inputs = [i.name for i in quantized.graph.input if i.name not in consts]
    if len(f_inputs) != len(q_inputs):
        raise ConfigError(f"{option}= takes inputs {q_inputs} but model= takes {f_inputs}; give a quantized model= ")
    tensor.update(zip(q_inputs, f_inputs))
    used: Set[str] = set()
    for f_node, q_node in pairs:
        recipes: Dict[int, Recipe] = {}
        for k, (f_in, q_in) in enumerate(zip(f_node.input, q_node.input)):
            if q_in in chains:
                chain = chains[q_in]
                used.add(q_in)
                source = chain.source
                init = consts.get(source) if source is not None else None
                if source is not None and init is None and not same(f_in, tensor.get(source)):
                    raise _differs(option, f_node, q_node, k, f"reads {source} through Q/DQ where model= reads {f_in}")
                if source is None and f_in not in f_inits:
                    raise _differs(
                        option, f_node, q_node, k, f"reads a stored quantized weight where model= reads {f_in}"
                    )
                recipes[k] = Recipe(chain, init)
            elif q_in in consts:
                if f_in not in f_inits:
                    raise _differs(option, f_node, q_node, k, f"reads a constant where model= reads {f_in}")
                if (
                    raw_bytes(consts[q_in]) != raw_bytes(f_inits[f_in])
                    or consts[q_in].data_type != f_inits[f_in].data_type
                ):
                    recipes[k] = Recipe(None, consts[q_in])  # a corrected bias
            elif not same(f_in, tensor.get(q_in, q_in)):
                raise _differs(option, f_node, q_node, k, f"reads {q_in} where model= reads {f_in}")
        if len(f_node.input) != len(q_node.input):
            raise _differs(option, f_node, q_node, len(f_node.input), "has another number of inputs")
        for q_out, f_out in zip(q_node.output, f_node.output):
            tensor[q_out] = f_out
        if recipes:
            given.recipes[f_node.name] = recipes
        if any(r.chain is not None for r in recipes.values()):
            given.units.append(f_node.name)
    _output_chains(given, model, quantized, chains, tensor, used, option)
    return given


def _quantized_type(chain: Chain, consts: Dict[str, TensorProto]) -> Optional[int]:
    """The element type a chain quantizes to: its DequantizeLinear's zero point's, else its input's."""
    dq = chain.nodes[-1]
    for name in (dq.input[2] if len(dq.input) > 2 else "", dq.input[0]):
        if name in consts:
            return consts[name].data_type
    return TensorProto.UINT8 if len(dq.input) < 3 else None  # no zero point: uint8 by ONNX's rule


#: activations a quantizer may remove where the Q/DQ after them clamps as they do (ONNX Runtime's quantize_static
#: removes a Relu or Clip after a quantized node unless told to keep it: ``QDQKeepRemovableActivations``)
REMOVABLE = frozenset({"Relu", "Clip"})


def _matched(
    model: onnx.ModelProto, quantized: onnx.ModelProto, option: str
) -> Tuple[List[Tuple[onnx.NodeProto, onnx.NodeProto]], Dict[str, str]]:
    """``model=``'s compute nodes paired with the quantized model's: by name where the quantized model's names are
    all ``model=``'s (its quantizer may have removed Relu and Clip nodes, ``REMOVABLE``), else by position.

    Returns:
        (the pairs, ``{output of a removed node: its input}``).

    Raises:
        ConfigError: another count, or another op type at a position, or a removed node that is no Relu or Clip
            (the first difference named).
    """
    f_nodes = [n for n in compute_nodes(model)]
    q_nodes = [n for n in compute_nodes(quantized)]
    by_name = {n.name: n for n in q_nodes}
    removed: Dict[str, str] = {}
    if len(by_name) == len(q_nodes) and set(by_name) <= {n.name for n in f_nodes}:
        pairs = [(f, by_name[f.name]) for f in f_nodes if f.name in by_name]
        for f in f_nodes:
            if f.name in by_name:
                continue
            if f.op_type not in REMOVABLE or not f.input or not f.output:
                raise ConfigError(
                    f"{option}= is no quantized version of model=: model='s {f.name} ({f.op_type}) is not in it; "
                    "quantize model= itself (a copy of it), keeping its nodes, and give that"
                )
            removed[f.output[0]] = f.input[0]
    else:
        pairs = list(zip(f_nodes, q_nodes))
        if len(f_nodes) != len(q_nodes):
            i = len(pairs)
            for k, (f, q) in enumerate(pairs):
                if f.op_type != q.op_type:
                    i = k
                    break
            extra = q_nodes[i] if len(q_nodes) > i else f_nodes[i]
            whose = f"{option}=" if len(q_nodes) > i else "model="
            raise ConfigError(
                f"{option}= is no quantized version of model=: it has {len(q_nodes)} compute nodes (not Q/DQ) where "
                f"model= has {len(f_nodes)}; the first without a match is {whose}'s #{i} {extra.name} "
                f"({extra.op_type}); quantize model= itself (a copy of it) and give that"
            )
    for i, (f, q) in enumerate(pairs):
        if f.op_type != q.op_type:
            raise ConfigError(
                f"{option}= is no quantized version of model=: its compute node #{i} is {q.name or '?'} ({q.op_type}) "
                f"where model= has {f.name} ({f.op_type}); quantize model= itself (a copy of it) and give that"
            )
    return pairs, removed


def said_removed(model: onnx.ModelProto, removed: Dict[str, str], option: str) -> None:
    """Log which of ``model=``'s nodes the quantizer removed (``removed``: output of a removed node: its input), by
    op type with the first names: the candidates keep them."""
    gone = [n for n in model.graph.node if n.output and n.output[0] in removed]
    ops = Counter(n.op_type for n in gone)
    log.info(
        "%s=: its quantizer removed %d of model='s nodes into the Q/DQ ranges after them (%s: %s%s); the candidates "
        "keep them, as model= has them",
        option,
        len(gone),
        ", ".join(f"{count} {op}" for op, count in ops.most_common()),
        ", ".join(n.name for n in gone[:5]),
        ", ..." if len(gone) > 5 else "",
    )


def _differs(option: str, f_node: onnx.NodeProto, q_node: onnx.NodeProto, k: int, what: str) -> ConfigError:
    return ConfigError(
        f"{option}= is no quantized version of model=: its node {q_node.name or '?'} ({q_node.op_type}, matched to "
        f"model='s {f_node.name}) {what} at input {k}; quantize model= itself (a copy of it) and give that"
    )


def _output_chains(
    given: Given,
    model: onnx.ModelProto,
    quantized: onnx.ModelProto,
    chains: Dict[str, Chain],
    tensor: Dict[str, str],
    used: Set[str],
    option: str,
) -> None:
    """Record the chains that quantize a node's output on its way to a graph output.

    Raises:
        ConfigError: a chain that makes a tensor no matched node reads and no graph output is.
    """
    outputs = {o.name: i for i, o in enumerate(quantized.graph.output)}
    f_outputs = [o.name for o in model.graph.output]
    producer = {o: (n, k) for n in model.graph.node for k, o in enumerate(n.output)}
    read_by_chain = {c.nodes[0].input[0] for c in chains.values()} | {
        n.input[0] for n in quantized.graph.node if n.op_type == "DequantizeLinear"
    }
    for out, chain in chains.items():
        if out in used or out in read_by_chain:
            continue
        if out not in outputs or chain.source is None or outputs[out] >= len(f_outputs):
            readers = [n.name for n in quantized.graph.node if out in n.input and not is_qdq(n)]
            if not readers:
                continue  # a chain nothing reads: the tool left it, the candidates leave it out
            raise ConfigError(f"{option}=: the Q/DQ making {out} feeds nodes model= does not match ({readers[:3]})")
        f_out = f_outputs[outputs[out]]
        made = producer.get(f_out)
        if made is None:
            raise ConfigError(f"{option}=: graph output {out} is quantized from a tensor no node of model= makes")
        node, k = made
        given.outputs.setdefault(node.name, {})[k] = chain
        if node.name not in given.units:
            given.units.append(node.name)
