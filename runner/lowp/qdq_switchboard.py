"""The switchboard of int8 candidates placed as TensorRT deploys them: one model that runs each.

``runner.lowp.placement.PlacedQuantizer`` writes a candidate's Q/DQ where TensorRT's int8 kernels
read them, site by site: each site is one input of one node, and a kept node reads its float inputs
whatever its neighbours do. So a candidate is the sum of its nodes' choices, and one model holds
them all: every node with sites becomes an ``If`` on a switch of its own
(``runner.lowp.switchboard.Wiring``), whose ``then`` branch reads its inputs through their
QuantizeLinear/DequantizeLinear (a weight through its int8 values' DequantizeLinear: the same
scales and int8 values as the candidate's, initializers of the switched model) and whose ``else``
branch is the node as it is.

Q/DQ are exact functions of their input, so a node that reads a shared tensor through its own Q/DQ
reads what the candidate's one shared Q/DQ gives; with ONNX Runtime's graph optimizations off (the
candidates' Q/DQ run as written, ``checker.graph_optimization_level=disable``) every candidate's
switched run gives its own run's bits, which ``runner.checkers.compare.switched`` checks on its first
candidates. ONNX Runtime's own placement (``quantization.placement=onnxruntime``) gets none: its
quantizer decides a node's Q/DQ from its neighbours' (keeping one node changes what the others
read), so its candidates are not sums of node choices.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import onnx
from onnx import TensorProto

from runner.lowp.placement import PlacedQuantizer
from runner.lowp.switchboard import Switchboard, Wiring, unsupported

log = logging.getLogger(__name__)


def build_qdq_switchboard(quantizer: PlacedQuantizer, key: str) -> Optional[Switchboard]:
    """The switchboard of ``quantizer``'s candidates, or None where it cannot be made.

    Args:
        quantizer: the run's quantizer with TensorRT's placement; its model's node indices are the
            switches' (the precision search's units).
        key: the session key of the switched model.

    Returns:
        The switchboard, its switches the nodes with Q/DQ sites; None (with a log line) for a model
        with If/Loop/Scan bodies, weights past ``MAP_BYTES``, no site, or a sited node whose output
        has no known type or is an optional output left out before a present one.

    Raises:
        ModelError: a weight cannot be quantized (``PlacedQuantizer.qdq``).
    """
    model = quantizer.model
    why = unsupported(model) or ("" if quantizer.sites else "the placement quantizes no node")
    why = why or ("" if quantizer.switchable else "a graph output is quantized")
    if why:
        log.info("No switched model: %s; each candidate is built", why)
        return None
    board = onnx.ModelProto()
    board.CopyFrom(model)
    wiring = Wiring(board.graph, quantizer.types)
    inits: Dict[str, TensorProto] = {}
    nodes: List[onnx.NodeProto] = []
    for i, node in enumerate(board.graph.node):
        sites = quantizer.sites.get(node.name)
        if not sites:
            nodes.append(node)
            continue
        if not wiring.can_switch(node):
            log.info("No switched model: node %s has an output of unknown type; each candidate is built", node.name)
            return None
        then: List[onnx.NodeProto] = []
        scales: List[TensorProto] = []
        inputs = quantizer.qdq_inputs(node, {}, then, scales, wiring.fresh)  # each branch its own Q/DQ
        for init in scales:  # shared by the branches that read the same tensor
            inits.setdefault(init.name, init)
        nodes.extend(wiring.switch(i, node, then, inputs))
    return wiring.finish(board, nodes, list(inits.values()), key)
