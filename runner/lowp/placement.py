"""int8 QDQ candidates placed as TensorRT deploys them (``quantization.placement=tensorrt``).

TensorRT builds a QDQ model strongly typed and fuses each Q/DQ pair into the int8 kernel of the
node that reads it; pointwise nodes after a Conv (BatchNormalization, activations, the Add of a
residual branch) fuse into the Conv's epilogue and need no Q/DQ of their own. So Q/DQ go where
TensorRT's int8 kernels read them, as TensorRT's QDQ placement recommendations and NVIDIA
ModelOpt's ``quantize_mode=int8`` place them:

- the data input of Conv, ConvTranspose, MatMul and Gemm (one scale per tensor) and their weight
  (one scale per output channel, ``quantization.per_channel``); biases stay float;
- the input of MaxPool, AveragePool, GlobalAveragePool and Resize;
- the residual input of an Add that joins a Conv branch (the input that does not come from the
  Conv, whose output the Add fuses with); an Add of two other tensors stays float;
- not: a Conv whose input and output channels are both under 16 and not multiples of 8, a
  MatMul/Gemm whose K or N is under 16 (TensorRT has no faster int8 kernel for them: ModelOpt's
  ``find_nodes_from_convs_to_exclude``, ``_MIN_MATMUL_DIM``), graph outputs.

Scales are symmetric int8 (zero point 0, -127..127 as TensorRT's ``amax / 127``): an activation's
from its calibrated range (``runner.lowp.calibration.calibrate``), a weight's from its values. Each
weight is quantized once per run and each candidate is the graph with its Q/DQ nodes written in
(``runner.graph.stubs``: no weight copied or converted per candidate), where ONNX Runtime's
quantizer took a second per candidate on the 672-node detector.

A kept node stays float: it reads its float inputs and weights, whatever its neighbours do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runner.errors import ModelError, first_line
from runner.graph.isolate import outer_reads
from runner.graph.meta import infer_shapes
from runner.graph.stubs import fill, raw_bytes, weightless
from runner.lowp.emulate import tensor_types

#: ops whose data input TensorRT reads int8 (index 0), with their weight input and its channel axis
WEIGHTED = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1, "Gemm": None}
#: ops whose input TensorRT reads int8 without a weight
POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "Resize"})
#: single-input pointwise ops TensorRT fuses into a Conv's epilogue (between a Conv and a residual Add)
EPILOGUE = frozenset(
    {"BatchNormalization", "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Identity", "Mul"}
)
#: below this K or N, a GEMM has no faster int8 kernel; below it, a Conv's channels must be multiples of 8
MIN_CHANNELS = 16
#: symmetric int8's largest magnitude (TensorRT's amax / 127)
QMAX = 127


@dataclass(frozen=True)
class Site:
    """One quantized input of a node.

    Attributes:
        index: the input's position.
        axis: for a weight, its channel axis (None: one scale for the whole weight); for an
            activation, None.
        weight: whether the input is a weight (an initializer).
    """

    index: int
    weight: bool = False
    axis: Optional[int] = None


def _gemm_axis(node: onnx.NodeProto) -> int:
    trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
    return 0 if trans_b else 1


class PlacedQuantizer:
    """Builds QDQ candidates of one model with TensorRT's placement, from one calibration.

    Args:
        model: the fp32 model (opset 13+, nodes named, Constant nodes as initializers: ``prepare_int8``).
        calibration: the run's ranges (``runner.lowp.calibration.Calibration``).
        options: ``runner.lowp.quant_options.QuantOptions`` (per_channel, op_types_to_quantize).

    Attributes:
        sites: ``{node name: its quantized inputs}`` when no node is kept.
        types: ``{tensor name: ONNX element type}`` of the model, from shape inference.

    Raises:
        ModelError: shape inference fails on the model.
    """

    #: every candidate is a sum of its nodes' input choices (``runner.lowp.qdq_switchboard`` holds them all)
    switchable = True

    def __init__(self, model: onnx.ModelProto, calibration: Any, options: Any):
        self.model, self.calibration, self.options = model, calibration, options
        self.bare, self.weights = weightless(model)
        try:
            typed = infer_shapes(self.bare)
        except Exception as e:  # onnx's inference raises InferenceError/ValidationError
            raise ModelError(f"shape inference fails on the model before quantization: {first_line(e)}") from None
        self.shapes = {
            v.name: [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            for v in list(typed.graph.value_info) + list(typed.graph.input) + list(typed.graph.output)
        }
        self.shapes.update({i.name: list(i.dims) for i in model.graph.initializer})
        self.types = tensor_types(typed)
        self.inits = {i.name: i for i in model.graph.initializer}
        self.ranges = {name: data.range_value for name, data in calibration.ranges.data.items()}
        self._lock = threading.Lock()
        self._quantized: Dict[Tuple[str, Optional[int]], Tuple[bytes, np.ndarray]] = {}
        self.sites = self._place()

    # -- where -------------------------------------------------------------------------------

    def _place(self) -> Dict[str, List[Site]]:
        g = self.model.graph
        allowed = set(self.options.op_types())
        producer = {o: n for n in g.node for o in n.output if o}
        readers: Dict[str, int] = {}
        for n in g.node:
            for name in set(n.input):
                readers[name] = readers.get(name, 0) + 1
        outputs = {o.name for o in g.output}
        sites: Dict[str, List[Site]] = {}
        for node in g.node:
            if node.op_type not in allowed:
                continue
            found: List[Site] = []
            if node.op_type in WEIGHTED and self._fast_enough(node):
                found = self._weighted(node)
            elif node.op_type in POOLS and node.input and self._activation(node.input[0], outputs):
                found = [Site(0)]
            elif node.op_type in ("Add", "Mul"):
                activations = [k for k, i in enumerate(node.input) if self._activation(i, outputs)]
                joins_conv = node.op_type == "Add" and self._residual(node, producer)
                heads = any(readers.get(node.input[k], 0) > 1 for k in activations)
                if activations and (joins_conv or heads):
                    found = [Site(k) for k in activations]
            if found:
                sites[node.name] = found
        return sites

    def _activation(self, name: str, outputs: Set[str]) -> bool:
        """A float activation with a calibrated range (a graph output is never rewired)."""
        return bool(name) and name not in self.inits and name in self.ranges and name not in outputs

    def _weighted(self, node: onnx.NodeProto) -> List[Site]:
        found: List[Site] = []
        data, weight = node.input[0], node.input[1] if len(node.input) > 1 else ""
        if data in self.ranges and data not in self.inits:
            found.append(Site(0))
        axis: Optional[int]
        if node.op_type == "Gemm":
            axis = _gemm_axis(node)
        else:
            axis = WEIGHTED[node.op_type]
        if weight in self.inits:
            rank = len(self.shapes.get(weight, []))
            if axis is not None and axis < 0:
                axis += rank
            found.append(Site(1, True, axis if self.options.per_channel else None))
        elif weight in self.ranges:  # MatMul of two activations (attention): both per tensor
            found.append(Site(1))
        return found if len(found) == len([i for i in node.input[:2] if i]) else []

    def _fast_enough(self, node: onnx.NodeProto) -> bool:
        """Whether TensorRT has a faster int8 kernel for this Conv/GEMM (its channels, K and N)."""
        weight = self.shapes.get(node.input[1], []) if len(node.input) > 1 else []
        if node.op_type in ("Conv", "ConvTranspose"):
            if len(weight) < 2:
                return False
            c_out, c_in = (weight[0], weight[1]) if node.op_type == "Conv" else (weight[1], weight[0])
            small = c_in < MIN_CHANNELS and c_out < MIN_CHANNELS
            return not small or c_in % 8 == 0 or c_out % 8 == 0
        dims = [d for d in weight[-2:] if d > 0] if weight else []
        return all(d >= MIN_CHANNELS for d in dims)

    def _residual(self, node: onnx.NodeProto, producer: Dict[str, onnx.NodeProto]) -> bool:
        """Whether an Add of two activations joins a Conv branch (one input comes from a Conv through
        pointwise ops TensorRT fuses into its epilogue): a residual Add."""
        if len(node.input) != 2 or any(i in self.inits or not i for i in node.input):
            return False
        return any(self._conv_behind(i, producer) is not None for i in node.input)

    def _conv_behind(self, name: str, producer: Dict[str, onnx.NodeProto]) -> Optional[str]:
        for _ in range(4):
            node = producer.get(name)
            if node is None:
                return None
            if node.op_type in ("Conv", "ConvTranspose"):
                return node.name
            floats = [i for i in node.input if i and i not in self.inits]
            if node.op_type not in EPILOGUE or len(floats) != 1:
                return None
            name = floats[0]
        return None

    # -- candidates --------------------------------------------------------------------------

    def convert(self, kept: Sequence[str]) -> onnx.ModelProto:
        """The model with Q/DQ where TensorRT places them, except at the nodes named in ``kept``,
        which stay float. A new model each call.

        Raises:
            ModelError: a weight cannot be quantized (a weight of an unexpected rank for its axis).
        """
        keep: FrozenSet[str] = frozenset(kept)
        out = onnx.ModelProto()
        out.CopyFrom(self.bare)
        g = out.graph
        nodes: List[onnx.NodeProto] = []
        made: Dict[Tuple[str, Optional[int], bool], str] = {}  # shared by every reader of a tensor
        new_inits: List[TensorProto] = []
        for node in g.node:
            if node.name not in keep:
                for slot, tensor in self.qdq_inputs(node, made, nodes, new_inits).items():
                    node.input[slot] = tensor
            nodes.append(node)
        del g.node[:]
        g.node.extend(nodes)
        read = {i for n in g.node for i in n.input} | outer_reads(g)
        stubs = [i for i in g.initializer if i.name in read or i.name not in self.weights]
        del g.initializer[:]
        g.initializer.extend(stubs)
        g.initializer.extend(new_inits)
        fill(out, lambda stub: raw_bytes(self.weights[stub.name]), [s.name for s in stubs if s.name in self.weights])
        return out

    def qdq_inputs(
        self,
        node: onnx.NodeProto,
        made: Dict[Tuple[str, Optional[int], bool], str],
        nodes: List[onnx.NodeProto],
        inits: List[TensorProto],
        rename: Callable[[str], str] = str,
    ) -> Dict[int, str]:
        """What ``node`` reads at each of its sites: ``{input position: a DequantizeLinear's output}``,
        the Q/DQ made with ``qdq`` (appended to ``nodes`` and ``inits``) unless ``made`` holds them.

        Args:
            made: ``{(tensor, axis, weight): its DequantizeLinear's output}`` made so far; updated.
            rename: as ``qdq``'s.

        Raises:
            ModelError: as ``qdq``.
        """
        reads: Dict[int, str] = {}
        for site in self.sites.get(node.name, []):
            name = node.input[site.index]
            key = (name, site.axis, site.weight)
            if key not in made:
                made[key] = self.qdq(name, site, nodes, inits, rename)
            reads[site.index] = made[key]
        return reads

    def qdq(
        self,
        name: str,
        site: Site,
        nodes: List[onnx.NodeProto],
        inits: List[TensorProto],
        rename: Callable[[str], str] = str,
    ) -> str:
        """Append the Q/DQ (activation) or DQ (weight) nodes of ``name`` to ``nodes`` and their
        scales (and a weight's int8 values) to ``inits``; return the DequantizeLinear's output.

        Args:
            name: the tensor read at ``site``.
            rename: maps each new node's name and output name (``runner.lowp.qdq_switchboard``:
                fresh names in each switched node's branch); initializer names stay as made.

        Raises:
            ModelError: a weight cannot be quantized (a weight of an unexpected rank for its axis).
        """
        if site.weight:
            data, scales = self._weight(name, site.axis)
            suffix = "" if site.axis is None else f"_axis{site.axis}"
            q = TensorProto(name=f"{name}_quantized{suffix}", data_type=TensorProto.INT8, dims=self.shapes[name])
            q.raw_data = data
            scale = numpy_helper.from_array(scales.astype(np.float32), f"{name}_scale{suffix}")
            zero = numpy_helper.from_array(np.zeros(scales.shape, np.int8), f"{name}_zero_point{suffix}")
            inits.extend([q, scale, zero])
            out = rename(f"{name}_DequantizeLinear_Output{suffix}")
            inputs = [q.name, scale.name, zero.name]
            dq = helper.make_node("DequantizeLinear", inputs, [out], name=rename(f"{name}_DequantizeLinear"))
            if site.axis is not None:
                dq.attribute.append(helper.make_attribute("axis", site.axis))
            nodes.append(dq)
            return out
        return self._activation_qdq(name, nodes, inits, rename)

    #: the largest magnitude of the Q/DQ's element type (int8's 127; a subclass's: fp8's 448)
    max_value: float = QMAX
    #: what the names of an activation's scale and zero point carry after the tensor's ("" for int8, "_fp8")
    tag = ""

    def _zero_point(self, name: str) -> TensorProto:
        """An activation's zero point named ``name``: 0 in the Q/DQ's element type (int8 here)."""
        return numpy_helper.from_array(np.array(0, np.int8), name)

    def _activation_qdq(
        self, name: str, nodes: List[onnx.NodeProto], inits: List[TensorProto], rename: Callable[[str], str]
    ) -> str:
        """Append the QuantizeLinear and DequantizeLinear of activation ``name`` (one scale: its calibrated amax over
        ``max_value``) to ``nodes``, their scale and zero point to ``inits``; return the DequantizeLinear's output."""
        amax = float(np.max(np.abs(np.asarray(self.ranges[name], dtype=np.float64))))
        value = np.array(amax / self.max_value if amax > 0 else 1.0, np.float32)
        scale = numpy_helper.from_array(value, f"{name}{self.tag}_scale")
        zero = self._zero_point(f"{name}{self.tag}_zero_point")
        inits.extend([scale, zero])
        quantized, out = rename(f"{name}_QuantizeLinear_Output"), rename(f"{name}_DequantizeLinear_Output")
        nodes.append(
            helper.make_node(
                "QuantizeLinear", [name, scale.name, zero.name], [quantized], name=rename(f"{name}_QuantizeLinear")
            )
        )
        nodes.append(
            helper.make_node(
                "DequantizeLinear", [quantized, scale.name, zero.name], [out], name=rename(f"{name}_DequantizeLinear")
            )
        )
        return out

    def _cached(
        self, key: Tuple[str, Optional[int]], quantize: Callable[[], Tuple[bytes, np.ndarray]]
    ) -> Tuple[bytes, np.ndarray]:
        """A weight's quantized bytes and scales, made by ``quantize`` once per run and ``key`` (thread-safe: the
        candidates are built ahead in threads)."""
        with self._lock:
            found = self._quantized.get(key)
        if found is not None:
            return found
        found = quantize()
        with self._lock:
            self._quantized[key] = found
        return found

    def _weight(self, name: str, axis: Optional[int]) -> Tuple[bytes, np.ndarray]:
        """A weight quantized symmetric int8 (once per run): (int8 bytes, scales per channel or one)."""
        return self._cached((name, axis), lambda: self._quantize(name, axis))

    def _quantize(self, name: str, axis: Optional[int]) -> Tuple[bytes, np.ndarray]:
        """Weight ``name`` quantized symmetric int8, per channel along ``axis`` or with one scale."""
        values = numpy_helper.to_array(self.inits[name])
        values = values.astype(np.float32)
        if axis is None:
            amax = np.array(np.abs(values).max() if values.size else 0.0, np.float32)
            shaped = amax
        else:
            reduce = tuple(d for d in range(values.ndim) if d != axis)
            amax = np.abs(values).max(axis=reduce) if values.size else np.zeros(values.shape[axis], np.float32)
            shape = [1] * values.ndim
            shape[axis] = -1
            shaped = amax.reshape(shape)
        scales = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
        scaled = np.where(shaped > 0, shaped / QMAX, 1.0).astype(np.float32)
        q = np.clip(np.rint(values / scaled), -QMAX, QMAX).astype(np.int8)
        return q.tobytes(), scales
