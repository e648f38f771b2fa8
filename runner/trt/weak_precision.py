"""TensorRT 10 and older: mark layers in higher precision on a weakly typed network.

For users who have not moved to strongly typed engines: the fp32 ONNX model is parsed without
STRONGLY_TYPED, FP16 (or BF16) is enabled, precision constraints are obeyed, and the layers
that came from kept ONNX nodes run in fp32. TensorRT 11 removed all of this (BuilderFlag.FP16,
layer precisions, precision constraints); there, use the ONNX-level candidates instead.
"""

from __future__ import annotations

import logging
from typing import Iterable

import tensorrt as trt

from runner.errors import ConfigError, ModelError
from runner.lowp.precisions import FLOAT16, LowPrecision

log = logging.getLogger(__name__)


def build_weakly_typed(onnx_bytes: bytes, kept: Iterable[str], low: LowPrecision = FLOAT16) -> bytes:
    """Build an engine with every layer in ``low`` except those from the kept ONNX nodes.

    A TensorRT layer belongs to a kept node when its name is the node's name or starts with
    the node's name followed by a separator (the ONNX parser names layers that way).

    Args:
        onnx_bytes: the fp32 ONNX model.
        kept: names of ONNX nodes to run in fp32.
        low: "float16" or "bfloat16".

    Returns:
        The serialized engine.

    Raises:
        ConfigError: on TensorRT 11 or newer (no weak typing).
        ModelError: when parsing or building fails.
    """
    if int(trt.__version__.split(".")[0]) >= 11:
        raise ConfigError(
            "weak typing (layer precisions) was removed in TensorRT 11; use the ONNX-level precision candidates"
        )
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        raise ModelError(
            "TensorRT's ONNX parser rejected the model: "
            f"{parser.get_error(0).desc() if parser.num_errors else 'unknown error'}"
        )
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.BF16 if str(low) == "bfloat16" else trt.BuilderFlag.FP16)
    config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
    names = set(kept)
    marked = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.name in names or any(layer.name.startswith(n + sep) for n in names for sep in ("_", ".", " ", "/")):
            layer.precision = trt.float32
            for j in range(layer.num_outputs):
                layer.set_output_type(j, trt.float32)
            marked += 1
    log.info("Marked %d TensorRT layers to run in float32 for %d kept ONNX nodes", marked, len(names))
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ModelError("TensorRT failed to build the engine (see the TensorRT log above)")
    return bytes(memoryview(serialized))
