"""Build TensorRT engines from an ONNX model: parse once, build as often as needed.

Engines are built strongly typed: precision comes from the ONNX model's own types (TensorRT 11
removed weak typing; on TensorRT 10 the same flag exists). Tactic records come from the
algorithm selector on TensorRT 10 (Polygraphy's replay layout) or from the editable timing
cache on TensorRT 11, which removed the algorithm selector.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorrt as trt

from runner.errors import ModelError
from runner.trt.builder_options import apply_builder_options
from runner.trt.tactics import TacticRecorder, timing_cache_record

log = logging.getLogger(__name__)

#: {input name: (min shape, opt shape, max shape)}
Profile = Dict[str, Tuple[Sequence[int], Sequence[int], Sequence[int]]]


@dataclass
class BuildResult:
    """One build's engine and the tactics it chose.

    Attributes:
        engine: the serialized engine (bytes).
        tactics: the tactic record (JSON-able); its "format" key names the layout.
    """

    engine: bytes
    tactics: Dict[str, Any] = field(default_factory=dict)


class _Logger(trt.ILogger):
    def __init__(self) -> None:
        trt.ILogger.__init__(self)

    def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
        if severity <= trt.ILogger.Severity.WARNING:
            log.warning("TensorRT: %s", msg)
        else:
            log.debug("TensorRT: %s", msg)


class EngineBuilder:
    """Parses an ONNX model into a strongly typed TensorRT network once; builds engines from it.

    Args:
        onnx_bytes: the serialized ONNX model.
        workspace: workspace memory pool limit in bytes, or None for TensorRT's default.
        profiles: optimization profiles for dynamic inputs.
        timing_cache: a serialized timing cache to start from, or None.
        options: ``builder.*`` settings, checked (``runner.trt.builder_options.check_builder_options``).

    Raises:
        ModelError: when the ONNX parser rejects the model (its first error is quoted).
    """

    def __init__(
        self,
        onnx_bytes: bytes,
        workspace: Optional[int] = None,
        profiles: Sequence[Profile] = (),
        timing_cache: Optional[bytes] = None,
        options: Optional[Dict[str, Any]] = None,
    ):
        self.logger = _Logger()
        self.options = dict(options or {})
        self.builder = trt.Builder(self.logger)
        flags = 0
        strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        if strongly_typed is not None:
            flags |= 1 << int(strongly_typed)
        self.network = self.builder.create_network(flags)
        self.parser = trt.OnnxParser(self.network, self.logger)
        if not self.parser.parse(onnx_bytes):
            first = self.parser.get_error(0) if self.parser.num_errors else None
            raise ModelError(
                f"TensorRT's ONNX parser rejected the model: {first.desc() if first is not None else 'unknown error'}"
            )
        self.workspace = workspace
        self.profiles = list(profiles)
        self.timing_cache = timing_cache
        self.major = int(trt.__version__.split(".")[0])

    def _config(self, record: Optional[TacticRecorder]) -> trt.IBuilderConfig:
        config = self.builder.create_builder_config()
        if self.workspace is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(self.workspace))
        for shapes in self.profiles:
            profile = self.builder.create_optimization_profile()
            for name, (lo, opt, hi) in shapes.items():
                profile.set_shape(name, trt.Dims(list(lo)), trt.Dims(list(opt)), trt.Dims(list(hi)))
            config.add_optimization_profile(profile)
        if record is not None:
            config.algorithm_selector = record
        elif hasattr(trt.BuilderFlag, "EDITABLE_TIMING_CACHE"):
            config.set_flag(trt.BuilderFlag.EDITABLE_TIMING_CACHE)
        cache = config.create_timing_cache(self.timing_cache or b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
        apply_builder_options(config, self.options, trt)
        return config

    def build(self) -> BuildResult:
        """Build one engine and record its tactics.

        Raises:
            ModelError: when TensorRT fails to build the engine.
        """
        record = TacticRecorder() if self.major < 11 and hasattr(trt, "IAlgorithmSelector") else None
        config = self._config(record)
        serialized = self.builder.build_serialized_network(self.network, config)
        if serialized is None:
            raise ModelError("TensorRT failed to build an engine (see the TensorRT log above)")
        tactics = (
            record.to_replay()
            if record is not None
            else timing_cache_record(config.get_timing_cache(), trt.__version__)
        )
        return BuildResult(bytes(memoryview(serialized)), tactics)

    def mark_outputs(self, names: Optional[Sequence[str]] = None) -> List[str]:
        """Mark network tensors as outputs (``polygraphy run --trt-outputs mark all``): the layer
        outputs named in ``names``, or every layer output when None. Marked tensors are not fused
        away, so the engine reports each one.

        Returns:
            The names of the tensors newly marked.
        """
        wanted = None if names is None else set(names)
        current = {self.network.get_output(i).name for i in range(self.network.num_outputs)}
        marked: List[str] = []
        for i in range(self.network.num_layers):
            layer = self.network.get_layer(i)
            for j in range(layer.num_outputs):
                tensor = layer.get_output(j)
                if tensor.name in current or (wanted is not None and tensor.name not in wanted):
                    continue
                self.network.mark_output(tensor)
                current.add(tensor.name)
                marked.append(tensor.name)
        return marked


def profiles_from_shapes(shapes: Mapping[str, Sequence[int]]) -> List[Profile]:
    """One profile with min = opt = max = the given shape per input (``model_input_shapes``)."""
    if not shapes:
        return []
    return [{name: (list(s), list(s), list(s)) for name, s in shapes.items()}]
