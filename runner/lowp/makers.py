"""The candidate makers: for each kind of low precision, the one object that turns a kept set into a candidate.

A precision search asks a maker three things and never which kind it holds (Hypothesis's shrinker keeps its
loop in one template and each type in a small class; Polygraphy's ``debug precision`` has one
``mark_layers``):

- ``candidate(kept)``: the model in the low precision except the nodes named in ``kept``;
- ``describe(kept, total)``: how the candidate reads in the log ("3 of 146 nodes out of int8");
- ``switchboard(key)``: one switched model that runs every candidate as its feeds, built on first use, or None
  where the candidates are no sum of node choices (the switched model says which checker backend runs it).

One maker per kind, each a small subclass of ``CandidateMaker``:

- ``CastMaker``: fp16 and bf16, nodes cast (``runner.lowp.convert.Converter``), switched under emulation, and
  natively on ONNX Runtime with graph optimizations off (a GPU's provider included);
- ``PlacedMaker``: Q/DQ where TensorRT reads them (``runner.lowp.placement``: int8, fp8 through
  ``runner.lowp.fp8``, and a quantized model another tool made, ``runner.lowp.given_qdq``), switched on ONNX
  Runtime;
- ``OnnxRuntimeMaker``: ONNX Runtime's own placement (``runner.lowp.quantize.Quantizer``), no switchboard (its
  quantizer decides a node's Q/DQ from its neighbours');
- ``MixedMaker``: int8 with the rest in fp16 (``runner.lowp.mixed_qdq``), keeping nodes in fp32 besides.

``make_maker`` makes the maker a ``LowPrecision`` record names (``LowPrecision.maker``, looked up in ``MAKERS``) with
the run's calibration and options; ``QdqMaker.with_rest`` the mixed one.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Set

import onnx

from runner.errors import ConfigError
from runner.lowp.convert import Converter
from runner.lowp.precisions import LowPrecision
from runner.lowp.switchboard import LazySwitchboard, RunsOn


class CandidateMaker(abc.ABC):
    """Turns a kept set into a candidate (module docstring).

    Attributes:
        model: the prepared fp32 model whose node names a kept set holds.
        low: the low precision.
        calibration: the run's calibration (``runner.lowp.calibration.Calibration``), or None (casts, a given
            quantized model).
    """

    def __init__(self, model: onnx.ModelProto, low: LowPrecision, calibration: Any = None):
        self.model, self.low, self.calibration = model, low, calibration
        self._board: Optional[LazySwitchboard] = None

    @abc.abstractmethod
    def candidate(self, kept: Sequence[str]) -> onnx.ModelProto:
        """The model in the low precision except the nodes named in ``kept``. A new model each call.

        Raises:
            ModelError: the conversion or quantization fails on the model.
        """

    @property
    def weightless(self) -> bool:
        """Whether its candidates hold no weight of their own: a large model's fp16/bf16 candidates point into the
        weight file (``runner.graph.weight_file``), so building one ahead holds its graph only."""
        return False

    def describe(self, kept: int, total: int) -> str:
        """A candidate keeping ``kept`` of ``total`` searchable nodes, as the log says it (kept nodes run in
        float32, out of the low precision)."""
        return f"{kept} of {total} nodes in float32"

    def switchboard(self, key: str) -> Optional[LazySwitchboard]:
        """The switched model of the candidates (``runner.lowp.switchboard``), built on first use, one per maker;
        None where the candidates are no sum of node choices."""
        if self._board is None:
            self._board = self._switchboard(key)
        return self._board

    def _switchboard(self, key: str) -> Optional[LazySwitchboard]:
        return None

    def none_quantized(self) -> str:
        """Why its candidates quantize no node of the model (said when none is, in place of a search)."""
        return "no float node of a quantizable op type"

    def with_rest(self, rest: LowPrecision) -> MixedMaker:
        """The maker of this maker's candidates with every node outside the low precision in ``rest``.

        Raises:
            ConfigError: the candidates are no Q/DQ model (casts: every node is either low or float32).
        """
        raise ConfigError(
            f"quantization.float_precision={rest} runs the nodes outside a quantized precision in {rest}; "
            f"{self.low} has no such nodes: drop it"
        )


class CastMaker(CandidateMaker):
    """fp16 and bf16: every float node cast except the kept ones (``Converter``).

    Args:
        converter: the converter of ``model`` (each weight's low-precision form made once per run).
    """

    def __init__(self, converter: Converter):
        super().__init__(converter.model, converter.low)
        self.converter = converter

    def candidate(self, kept: Sequence[str]) -> onnx.ModelProto:
        return self.converter.convert(kept)

    @property
    def weightless(self) -> bool:
        return self.converter.large

    def _switchboard(self, key: str) -> Optional[LazySwitchboard]:
        from runner.lowp.fp16_switchboard import build_switchboard

        converter = self.converter
        return LazySwitchboard(
            lambda: build_switchboard(converter.model, converter, key),
            native=lambda: build_switchboard(converter.model, converter, f"{key}:native", native=True),
        )


class QdqMaker(CandidateMaker):
    """Q/DQ candidates of a quantizer (``convert(kept)``, ``model``, ``calibration``): int8 and fp8.

    Args:
        quantizer: the run's quantizer.
        low: its low precision.
    """

    def __init__(self, quantizer: Any, low: LowPrecision):
        super().__init__(quantizer.model, low, quantizer.calibration)
        self.quantizer = quantizer

    def candidate(self, kept: Sequence[str]) -> onnx.ModelProto:
        return self.quantizer.convert(kept)  # type: ignore[no-any-return]

    def none_quantized(self) -> str:
        """The quantizer's reason (``Fp8Quantizer.none_quantized``), where it has one."""
        reason = getattr(self.quantizer, "none_quantized", None)
        return reason() if callable(reason) else super().none_quantized()

    def with_rest(self, rest: LowPrecision) -> MixedMaker:
        """The maker of this maker's candidates with every node outside the low precision in ``rest`` (fp16:
        ``runner.lowp.mixed_qdq``)."""
        from runner.lowp.mixed_qdq import MixedQuantizer

        return MixedMaker(MixedQuantizer(self.quantizer, rest), self.low)


class PlacedMaker(QdqMaker):
    """Q/DQ where TensorRT reads them: int8, fp8 and a given quantized model (a ``PlacedQuantizer``)."""

    def _switchboard(self, key: str) -> Optional[LazySwitchboard]:
        from runner.lowp.qdq_switchboard import build_qdq_switchboard

        quantizer = self.quantizer
        return LazySwitchboard(lambda: build_qdq_switchboard(quantizer, key), RunsOn.ONNXRUNTIME)


class OnnxRuntimeMaker(QdqMaker):
    """ONNX Runtime's own int8 placement (``runner.lowp.quantize.Quantizer``): no switchboard (its quantizer decides a
    node's Q/DQ from its neighbours')."""


class MixedMaker(CandidateMaker):
    """int8 with the rest in fp16 (``runner.lowp.mixed_qdq.MixedQuantizer``): a candidate keeps some nodes out of
    int8 (in fp16) and some in fp32 (``candidate_with``).

    Args:
        mixed: the mixed quantizer (its int8 quantizer's model and calibration).
        low: the quantized precision (int8).
    """

    def __init__(self, mixed: Any, low: LowPrecision):
        super().__init__(mixed.quantizer.model, low, mixed.quantizer.calibration)
        self.mixed = mixed

    def candidate(self, kept: Sequence[str]) -> onnx.ModelProto:
        return self.candidate_with(kept, ())

    def candidate_with(self, out_of_int8: Sequence[str], fp32: Iterable[str]) -> onnx.ModelProto:
        """The candidate with ``out_of_int8`` out of int8 (in fp16) and ``fp32`` in float32.

        Raises:
            ModelError: the quantizer or the float16 converter fails on the model.
        """
        return self.mixed.convert(out_of_int8, fp32)  # type: ignore[no-any-return]

    def blocked(self, layers: Iterable[int]) -> Set[int]:
        """Float nodes of ``layers`` the fp16 converter never converts (``MixedQuantizer.blocked``)."""
        return set(self.mixed.blocked(self.model, layers))


def _casts(model: onnx.ModelProto, low: LowPrecision, calibration: Any, options: Any) -> CandidateMaker:
    return CastMaker(Converter(model, low))


def _qdq(model: onnx.ModelProto, low: LowPrecision, calibration: Any, options: Any) -> CandidateMaker:
    from runner.lowp.quantize import make_quantizer

    quantizer = make_quantizer(model, calibration, options)
    return PlacedMaker(quantizer, low) if options.placement == "tensorrt" else OnnxRuntimeMaker(quantizer, low)


def _fp8(model: onnx.ModelProto, low: LowPrecision, calibration: Any, options: Any) -> CandidateMaker:
    from runner.lowp.fp8 import Fp8Quantizer

    return PlacedMaker(Fp8Quantizer(model, calibration, options), low)


#: the maker of each kind a ``LowPrecision`` names (``LowPrecision.maker``): ``(model, low, calibration, options)``
#: to the maker; a new precision adds its record and, where its candidates are made another way, its entry here
MAKERS: Dict[str, Callable[[onnx.ModelProto, LowPrecision, Any, Any], CandidateMaker]] = {
    "casts": _casts,
    "qdq": _qdq,
    "fp8": _fp8,
}


def make_maker(
    model: onnx.ModelProto, low: LowPrecision, calibration: Any = None, options: Any = None
) -> CandidateMaker:
    """The candidate maker of ``low`` for ``model`` (``MAKERS[low.maker]``).

    Args:
        model: the prepared fp32 model (``runner.lowp.convert.prepare``, or ``prepare_int8`` for a quantized
            precision).
        low: the low precision.
        calibration: a quantized precision's ranges (``runner.lowp.calibration.calibrate``); None for casts.
        options: a quantized precision's ``QuantOptions`` (its placement picks ``PlacedMaker`` or
            ``OnnxRuntimeMaker``); None for casts.

    Raises:
        ModelError: the converter or quantizer cannot read the model (shape inference, an opset too old).
        KeyError: ``low.maker`` names no maker (a record without its entry: the tool's defect).
    """
    return MAKERS[low.maker](model, low, calibration, options)
