"""The error of each quantization point of a QDQ target: a float tensor against itself rounded
through its QuantizeLinear/DequantizeLinear pair, and a weight against its float original.

``runner.layerwise.compute.LayerwiseComparison`` runs every node alone with copies of its own Q/DQ
pairs (``runner.graph.isolate``); the isolated models also output each copied DequantizeLinear,
which ``QDQPairs.compare`` judges here, sample by sample, keeping each pair's worst.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import onnx

from runner.checkers.compare.tolerance import Tolerances, compare_tensor
from runner.graph.qdq import Chain, is_qdq
from runner.layerwise.tensors import worse


@dataclass
class PairRow:
    """One quantization point of a QDQ target: a float tensor rounded through Q/DQ (worst sample).

    Attributes:
        tensor: the float tensor (the reference's name; a weight's initializer name).
        dequantized: the DequantizeLinear output the target's nodes read.
        kind: "activation" or "weight".
        readers: the compute nodes that read the dequantized tensor.
        error: the dequantized value against the float one (``OutputStats`` fields, with
            ``sqnr_db``).
        clipped: the fraction of float values outside the dequantized range (saturated by the
            calibrated scale); 0 for weights, whose scale covers their range.
        channel_sqnr_db: the lowest SQNR (dB) of one channel (axis 1 of an activation, axis 0 of
            a weight), or None when every channel is exact: one scale for a tensor whose channels
            differ in range rounds the small channels away, which the tensor's SQNR hides and a
            reader that rescales channels (BatchNormalization, Mul) brings out.
    """

    tensor: str
    dequantized: str
    kind: str
    readers: List[str]
    error: Dict[str, Any] = field(default_factory=dict)
    clipped: float = 0.0
    channel_sqnr_db: Optional[float] = None


def channel_sqnr_db(actual: np.ndarray, golden: np.ndarray, axis: int) -> Optional[float]:
    """The lowest per-channel SQNR in dB (``-20 log10`` of each channel's relative L2 error along
    ``axis``) over channels with signal and error; None for a scalar/1-D tensor or when none has both."""
    if golden.ndim < 2 or axis >= golden.ndim:
        return None
    a = np.moveaxis(np.asarray(actual, np.float64), axis, 0).reshape(golden.shape[axis], -1)
    b = np.moveaxis(np.asarray(golden, np.float64), axis, 0).reshape(golden.shape[axis], -1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        noise = np.linalg.norm(a - b, axis=1)
        signal = np.linalg.norm(b, axis=1)
        ok = np.isfinite(noise) & np.isfinite(signal) & (noise > 0) & (signal > 0)
        if not ok.any():
            return None
        return float(np.min(20.0 * np.log10(signal[ok] / noise[ok])))


class QDQPairs:
    """The Q/DQ pairs a QDQ target's compute nodes read, and their errors.

    Args:
        reference: the float model (its initializers are the weights' float values).
        target: the QDQ model.
        chains: ``runner.graph.qdq.input_chains(target)``.
        ref_name: maps a target tensor to the reference tensor holding its value, or None.
        rule: the checker's tolerances (the statistics' atol/rtol).
    """

    def __init__(
        self,
        reference: onnx.ModelProto,
        target: onnx.ModelProto,
        chains: Mapping[str, Chain],
        ref_name: Callable[[str], Optional[str]],
        rule: Tolerances,
    ):
        self.chains, self.ref_name, self.rule = chains, ref_name, rule
        self.ref_weights = {i.name: i for i in reference.graph.initializer}
        self._inits = {i.name: i for i in target.graph.initializer}
        self.pairs: Dict[str, PairRow] = self._rows_of(reference, target)

    def _rows_of(self, reference: onnx.ModelProto, target: onnx.ModelProto) -> Dict[str, PairRow]:
        """A row per DequantizeLinear output the target's compute nodes read, keyed by it; a weight's
        float tensor is the one the reference's node of the same name reads at the same input."""
        readers: Dict[str, List[str]] = {}
        weight_of: Dict[str, str] = {}
        ref_nodes = {n.name: n for n in reference.graph.node}
        for node in target.graph.node:
            if is_qdq(node) or node.op_type == "Constant":
                continue
            for k, name in enumerate(node.input):
                chain = self.chains.get(name)
                if chain is None:
                    continue
                readers.setdefault(name, []).append(node.name)
                ref = ref_nodes.get(node.name)
                if chain.source is None and ref is not None and k < len(ref.input):
                    weight_of.setdefault(name, ref.input[k])
        rows: Dict[str, PairRow] = {}
        for dq, names in readers.items():
            chain = self.chains[dq]
            if chain.source is not None:
                rows[dq] = PairRow(self.ref_name(chain.source) or chain.source, dq, "activation", names)
            elif weight_of.get(dq) in self.ref_weights:
                rows[dq] = PairRow(weight_of[dq], dq, "weight", names)
        return rows

    def rows(self) -> List[PairRow]:
        """The pairs compared so far (``compare`` fills them), activations then weights, each in
        graph order; empty for a target without Q/DQ."""
        rows = [r for r in self.pairs.values() if r.error]
        return [r for r in rows if r.kind == "activation"] + [r for r in rows if r.kind == "weight"]

    def compare(self, got: Mapping[str, np.ndarray], ref_value: Callable[[str], Optional[np.ndarray]]) -> None:
        """Each copied Q/DQ pair's output (``got``, from the isolated models) against its float value."""
        from onnx import numpy_helper

        for dq, row in self.pairs.items():
            if dq not in got:
                continue
            if row.kind == "weight":
                if row.error:
                    continue  # the same every sample
                golden: Optional[np.ndarray] = numpy_helper.to_array(self.ref_weights[row.tensor])
            else:
                source = self.chains[dq].source
                golden = ref_value(source) if source is not None else None
            if golden is None or golden.dtype.kind != "f" or np.shape(golden) != np.shape(got[dq]):
                continue
            atol, rtol = self.rule.for_output(row.tensor)
            stats = asdict(compare_tensor(got[dq], golden, atol, rtol, self.rule, light=True))
            bounds = self._bounds(dq) if row.kind == "activation" else None
            if bounds is not None and golden.size:
                x = np.asarray(golden, np.float64)
                outside = np.count_nonzero((x < bounds[0]) | (x > bounds[1]))
                row.clipped = max(row.clipped, float(outside) / x.size)
            if not row.error or worse(stats, row.error):
                row.error = stats
            worst = channel_sqnr_db(np.asarray(got[dq]), np.asarray(golden), 1 if row.kind == "activation" else 0)
            if worst is not None and (row.channel_sqnr_db is None or worst < row.channel_sqnr_db):
                row.channel_sqnr_db = worst

    def _bounds(self, dq: str) -> Optional[Tuple[float, float]]:
        """The float range a per-tensor Q/DQ pair represents, half a step wider each side (a value
        outside it is saturated by the scale), from its scale and zero point initializers."""
        from onnx import numpy_helper

        q = self.chains[dq].nodes[0]
        if q.op_type != "QuantizeLinear" or len(q.input) < 2:
            return None
        scale = self._inits.get(q.input[1])
        zp = self._inits.get(q.input[2]) if len(q.input) > 2 else None
        if scale is None or np.prod(scale.dims, dtype=np.int64) != 1:
            return None
        step = float(numpy_helper.to_array(scale).reshape(()))
        zero = numpy_helper.to_array(zp) if zp is not None else np.zeros((), np.uint8)
        info = np.iinfo(zero.dtype) if zero.dtype.kind in "iu" else None
        if info is None:
            return None
        z = float(zero.reshape(()))
        return ((info.min - z - 0.5) * step, (info.max - z + 0.5) * step)
