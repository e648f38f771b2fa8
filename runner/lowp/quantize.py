"""int8 QDQ candidates: ONNX Runtime's static quantizer, calibrated once per run.

``quantize_static`` calibrates every time it is called: a precision search that called it per
candidate would pay a calibration (a run of the model over every sample with every tensor an
output) per check. Here the two halves it is made of are called apart, as ONNX Runtime's
``quantize_static`` calls them (``onnxruntime/python/tools/quantization/quantize.py``):

- ``calibrate`` (``runner.lowp.calibration``) runs ONNX Runtime's calibrator (``create_calibrator``:
  min/max, entropy or percentile) once over the samples and keeps the activation ranges (``TensorsData``);
- ``Quantizer.convert(kept)`` hands those ranges to ``QDQQuantizer`` with ``nodes_to_exclude=kept``
  for each candidate: a second or so on the 672-node detector, no model run.

A kept node stays float with its tensors: ONNX Runtime's quantizer excludes the node, but a tensor
it shares with a quantized reader still reaches it through that reader's Q/DQ pair, and a weight it
shares is stored int8; ``Quantizer.convert`` wires the kept node back to the float tensor and the
float weight, so keeping a node removes every rounding of its inputs.

The QDQ model written is what TensorRT builds strongly typed (symmetric int8, zero points 0, per-
channel weights) and what ONNX Runtime runs on CPU.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Sequence, Set, Tuple

import onnx

from runner.errors import ModelError, first_line
from runner.graph.isolate import outer_reads
from runner.graph.meta import infer_shapes
from runner.graph.qdq import is_qdq
from runner.lowp.calibration import Calibration
from runner.lowp.convert import raise_opset
from runner.lowp.quant_options import QuantOptions

log = logging.getLogger(__name__)

#: per-channel DequantizeLinear (its ``axis``) needs opset 13
INT8_OPSET = 13


def prepare_int8(
    model: onnx.ModelProto, in_place: bool = False, opset: int = 13, least: int = INT8_OPSET
) -> onnx.ModelProto:
    """``model`` made ready for ``calibrate`` and ``Quantizer``: opset ``opset`` (13 or more) or newer
    (raised with a log line; per-channel DequantizeLinear needs 13, fp16 Q/DQ 19:
    ``runner.lowp.mixed_qdq.MIXED_OPSET``), nodes named, Constant nodes as initializers (the
    quantizer quantizes weights and biases only when they are initializers). A copy, or ``model``
    itself with ``in_place`` when its opset is new enough (``prepare``).

    ``least`` is the opset below which the model is always raised (per-channel Q/DQ's 13); a quantized model
    another tool made at an older opset (ONNX Runtime's ``quantize_static`` keeps an opset-11 model's opset,
    per-tensor) gives its own: raising model= past it makes ONNX's version converter rewrite nodes the given
    model does not have (opset 11's Softmax became Shape, Flatten, Softmax and Reshape).

    Raises:
        ModelError: ONNX's version converter cannot raise the opset.
    """
    from runner.lowp.convert import prepare
    from runner.lowp.precisions import FLOAT16

    why = "int8 QDQ with per-channel weights" if opset <= INT8_OPSET else "int8 QDQ in float16"
    raised = raise_opset(model, max(opset, least), why)
    return prepare(raised, FLOAT16, in_place=in_place or raised is not model)  # names and initializers


def make_quantizer(model: onnx.ModelProto, calibration: Calibration, options: QuantOptions) -> Any:
    """The candidate builder ``options.placement`` names: ``runner.lowp.placement.PlacedQuantizer``
    (tensorrt) or ``Quantizer`` (onnxruntime); both have ``convert(kept)``, ``calibration``, ``model``.

    Raises:
        ModelError: shape inference fails on the model.
    """
    if options.placement == "tensorrt":
        from runner.lowp.placement import PlacedQuantizer

        return PlacedQuantizer(model, calibration, options)
    return Quantizer(model, calibration, options)


class Quantizer:
    """Builds QDQ candidates of one model from one calibration, as ONNX Runtime's quantizer places them.

    Args:
        model: the fp32 model, opset 13+, nodes named, Constant nodes as initializers.
        calibration: the run's ranges (``calibrate``).
        options: per-channel weights, symmetric activations, op types.

    Raises:
        ModelError: shape inference fails on the model.
    """

    def __init__(self, model: onnx.ModelProto, calibration: Calibration, options: QuantOptions):
        self.model, self.calibration, self.options = model, calibration, options
        try:
            self.inferred = infer_shapes(model)  # the quantizer reads tensor types from value_info
        except Exception as e:  # onnx's inference raises InferenceError/ValidationError
            raise ModelError(f"shape inference fails on the model before quantization: {first_line(e)}") from None
        self.nodes = {n.name: n for n in model.graph.node}
        self.inits = {i.name: i for i in model.graph.initializer}
        self._last: Dict[Tuple[str, ...], onnx.ModelProto] = {}  # the fully quantized model and the last one

    def convert(self, kept: Sequence[str]) -> onnx.ModelProto:
        """The model quantized to QDQ except the nodes named in ``kept``, which stay float with
        their inputs and weights. A new copy each call; the fully quantized model and the last
        one made are kept (the gates, the ranking and the answer ask for them again).

        Raises:
            ModelError: ONNX Runtime's quantizer fails on the model.
        """
        key = tuple(sorted(kept))
        if key not in self._last:
            built = self._convert(kept)
            self._last = {k: v for k, v in self._last.items() if not k} | {key: built}
        out = onnx.ModelProto()
        out.CopyFrom(self._last[key])
        return out

    def _convert(self, kept: Sequence[str]) -> onnx.ModelProto:
        from onnxruntime.quantization import QDQQuantizer, QuantType

        work = onnx.ModelProto()
        work.CopyFrom(self.inferred)
        activation = QuantType.QInt8 if self.options.symmetric_activations else QuantType.QUInt8
        extra = {
            "ActivationSymmetric": self.options.symmetric_activations,
            "WeightSymmetric": True,
            "QDQKeepRemovableActivations": True,  # every node of the model stays, kept or not
        }
        try:
            quantizer = QDQQuantizer(
                work,
                self.options.per_channel,
                False,
                QuantType.QInt8,
                activation,
                self.calibration.ranges,
                None,
                list(kept),
                self.options.op_types(),
                extra,
            )
            quantizer.quantize_model()
        except KeyboardInterrupt:
            raise
        except Exception as e:  # the quantizer raises ValueError/KeyError/AssertionError on models it cannot handle
            first = first_line(e)
            raise ModelError(f"ONNX Runtime's QDQ quantizer fails on the model ({first})") from None
        quantizer.model.topological_sort()  # it appends Q/DQ nodes (its save_model_to_file sorts too)
        out: onnx.ModelProto = quantizer.model.model
        self._float_inputs(out, set(kept))
        del out.graph.value_info[:]  # inferred before quantization; Q/DQ renamed what they describe
        return out

    def _float_inputs(self, model: onnx.ModelProto, kept: Set[str]) -> None:
        """Wire each kept node's inputs back to the float tensors and weights of the original, then
        drop the Q/DQ nodes and initializers nothing reads any more."""
        if not kept:
            return
        g = model.graph
        produced = {o for n in g.node for o in n.output} | {i.name for i in g.input}
        present = {i.name for i in g.initializer}
        for node in g.node:
            if node.name not in kept or node.name not in self.nodes:
                continue
            original = self.nodes[node.name]
            for k, name in enumerate(original.input):
                if k >= len(node.input) or node.input[k] == name or not name:
                    continue
                if name not in produced and name not in present:
                    if name not in self.inits:
                        continue
                    g.initializer.append(self.inits[name])
                    present.add(name)
                node.input[k] = name
        drop_unread(model)


def drop_unread(model: onnx.ModelProto) -> None:
    """Remove Q/DQ nodes whose outputs nothing reads (repeatedly), then unread initializers."""
    g = model.graph
    outputs = {o.name for o in g.output}
    while True:
        read = {i for n in g.node for i in n.input} | outputs | outer_reads(g)
        dead = [k for k, n in enumerate(g.node) if is_qdq(n) and not any(o in read for o in n.output)]
        if not dead:
            break
        for k in reversed(dead):
            del g.node[k]
    read = {i for n in g.node for i in n.input} | outer_reads(g)
    keep = [i for i in g.initializer if i.name in read]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)
