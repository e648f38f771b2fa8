"""fp8 (E4M3) candidates placed as TensorRT deploys them on Hopper: Q/DQ to float8e4m3fn (``low_precision=float8``).

TensorRT builds a QDQ model strongly typed and runs fp8 GEMMs and convolutions from Q/DQ on their data input and
weight. Here those go on Conv, MatMul and Gemm, except the Convs TensorRT has no fp8 kernel for (grouped,
depthwise ones, and those with 16 input or output channels or fewer): on the detector the same 36 Convs NVIDIA
ModelOpt 0.47's ``quantize_mode=fp8`` quantizes. ModelOpt also quantizes some pools, Resizes and
pointwise Adds/Muls of the detector's neck (27 more nodes); give its model as ``quantized_model=`` to search its
own placement. The quantized type is ``float8e4m3fn`` (4 exponent bits, 3 mantissa
bits, largest value 448): ``QuantizeLinear``/``DequantizeLinear`` at opset 19 with a float8 zero point, which
ONNX Runtime runs on its CPU provider. Scales come from the calibrated maximum (amax / 448: ``calibration``'s
``minmax``, what ModelOpt calls max calibration); each weight has one scale for the whole tensor, as ModelOpt's
fp8 weights do. Everything else (which nodes TensorRT has fast kernels for, a kept node staying float with its
own inputs, the switchboard of candidates) is ``runner.lowp.placement``'s.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runner.errors import ConfigError
from runner.lowp.placement import MIN_CHANNELS, PlacedQuantizer, Site

#: float8e4m3fn's largest finite value (TensorRT's fp8 scale is amax / 448)
FP8_MAX = 448.0
#: the ops whose data input and weight TensorRT reads in fp8
FP8_OPS = frozenset({"Conv", "MatMul", "Gemm"})
#: QuantizeLinear/DequantizeLinear take float8 types from this opset
FP8_OPSET = 19


def check_fp8(options: Any) -> None:
    """Refuse the quantization keys fp8 does not take.

    Raises:
        ConfigError: ONNX Runtime's placement (it places int8 only), or the rest in fp16 (int8 with fp16 is
            TensorRT's ``--int8 --fp16``; fp8 is a precision of its own).
    """
    if options.placement != "tensorrt":
        raise ConfigError(
            f"low_precision=float8 with quantization.placement={options.placement}: fp8 is placed as TensorRT deploys "
            "it (ModelOpt's fp8 placement); drop quantization.placement"
        )
    if options.float16_rest:
        raise ConfigError(
            "low_precision=float8 with quantization.float_precision=float16: the rest in fp16 is int8's (TensorRT's "
            "--int8 --fp16); drop it"
        )


def _zero(name: str, shape: Tuple[int, ...] = ()) -> TensorProto:
    """A float8e4m3fn zero point of ``shape`` (all zeros)."""
    return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(shape), [0.0] * int(np.prod(shape, dtype=int)))


def fp8_bytes(values: np.ndarray, scale: np.ndarray) -> bytes:
    """``values / scale`` saturated to +-448 and rounded to float8e4m3fn (nearest even), as little-endian bytes."""
    scaled = np.clip(values.astype(np.float32) / scale, -FP8_MAX, FP8_MAX)
    return bytes(scaled.astype(ml_dtypes.float8_e4m3fn).tobytes())


class Fp8Quantizer(PlacedQuantizer):
    """Builds fp8 QDQ candidates of one model with ModelOpt's fp8 placement, from one calibration.

    Args:
        model: the fp32 model at opset 19 or newer (``prepare_int8(model, opset=FP8_OPSET)``), nodes named,
            Constant nodes as initializers.
        calibration: the run's ranges (amax from them).
        options: ``runner.lowp.quant_options.QuantOptions`` (op_types_to_quantize).

    Raises:
        ModelError: shape inference fails on the model.
    """

    def _place(self) -> Dict[str, List[Site]]:
        """Sites: the data input and weight (one scale) of each Conv, MatMul and Gemm TensorRT runs in fp8
        (``_fp8_conv``, and int8's rule for a GEMM's K and N)."""
        allowed = set(self.options.op_types())
        sites: Dict[str, List[Site]] = {}
        for node in self.model.graph.node:
            if node.op_type not in FP8_OPS or node.op_type not in allowed:
                continue
            if not (self._fp8_conv(node) if node.op_type == "Conv" else self._fast_enough(node)):
                continue
            found = [Site(s.index, s.weight, None) for s in self._weighted(node)]  # per-tensor weights
            if found:
                sites[node.name] = found
        return sites

    def none_quantized(self) -> str:
        """Why no node of the model got fp8 sites: its Convs, MatMuls and Gemms, counted by what left them out."""
        allowed = set(self.options.op_types())
        found = [n for n in self.model.graph.node if n.op_type in FP8_OPS]
        if not found:
            return "it has no Conv, MatMul or Gemm, the ops TensorRT runs in fp8"
        grouped = [
            n for n in found if n.op_type == "Conv" and next((a.i for a in n.attribute if a.name == "group"), 1) > 1
        ]
        narrow = [n for n in found if n.op_type == "Conv" and n not in grouped and not self._fp8_conv(n)]
        small = [n for n in found if n.op_type != "Conv" and not self._fast_enough(n)]
        parts = [f"{len(narrow)} Conv{'s' * (len(narrow) != 1)} of {MIN_CHANNELS} channels or fewer in or out"] * bool(
            narrow
        )
        parts += [f"{len(grouped)} grouped Conv{'s' * (len(grouped) != 1)}"] * bool(grouped)
        parts += [f"{len(small)} MatMul/Gemm with K or N under {MIN_CHANNELS}"] * bool(small)
        other = len(found) - len(narrow) - len(grouped) - len(small)
        parts += [f"{other} not in quantization.op_types ({', '.join(sorted(allowed))})"] * bool(other)
        return f"TensorRT has no fp8 kernel for its {', '.join(parts)}"

    def _fp8_conv(self, node: onnx.NodeProto) -> bool:
        """Whether TensorRT has an fp8 kernel for this Conv: not grouped, more than 16 input and output channels (as
        ModelOpt 0.47 chooses on the detector: a 32-by-16 Conv stays float, an 18-by-96 one does not)."""
        if next((a.i for a in node.attribute if a.name == "group"), 1) > 1:
            return False
        weight = self.shapes.get(node.input[1], []) if len(node.input) > 1 else []
        return len(weight) >= 2 and weight[0] > MIN_CHANNELS and weight[1] > MIN_CHANNELS

    def qdq(
        self,
        name: str,
        site: Site,
        nodes: List[onnx.NodeProto],
        inits: List[TensorProto],
        rename=str,
    ) -> str:
        """Append the fp8 Q/DQ (activation) or DQ (weight) of ``name``; return the DequantizeLinear's output."""
        if site.weight:
            data, scale = self._weight(name, None)
            q = TensorProto(name=f"{name}_fp8", data_type=TensorProto.FLOAT8E4M3FN, dims=self.shapes[name])
            q.raw_data = data
            scales = numpy_helper.from_array(np.asarray(scale, np.float32), f"{name}_fp8_scale")
            zero = _zero(f"{name}_fp8_zero_point")
            inits.extend([q, scales, zero])
            out = rename(f"{name}_DequantizeLinear_Output")
            nodes.append(
                helper.make_node(
                    "DequantizeLinear", [q.name, scales.name, zero.name], [out], name=rename(f"{name}_DequantizeLinear")
                )
            )
            return out
        return self._activation_qdq(name, nodes, inits, rename)

    max_value = FP8_MAX
    tag = "_fp8"

    def _zero_point(self, name: str) -> TensorProto:
        """A float8e4m3fn zero point (0)."""
        return _zero(name)

    def _weight(self, name: str, axis: Optional[int]) -> Tuple[bytes, np.ndarray]:
        """A weight in float8e4m3fn with one scale (once per run): (its bytes, the scale)."""

        def quantize() -> Tuple[bytes, np.ndarray]:
            values = numpy_helper.to_array(self.inits[name]).astype(np.float32)
            amax = float(np.abs(values).max()) if values.size else 0.0
            scale = np.array(amax / FP8_MAX if amax > 0 else 1.0, np.float32)
            return fp8_bytes(values, scale), scale

        return self._cached((name, None), quantize)
