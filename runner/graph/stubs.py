"""Weightless copies of a model: the graph with its large initializers as stubs (name, type, dims, no
values), for the work that reads only the graph (conversion, type inference, validation, the
emulation rewrite), and the values put back once, from a cache, into the model that runs.

A candidate of a 222 MB decoder cost 0.9 s to convert, 0.85 s to validate and 0.9 s to emulate
when each step copied or converted every weight (``benchmarks/candidate_cost.py``); on stubs each
step costs what the graph costs, and each weight is converted once per run.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Set

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

#: initializers of this many bytes or more become stubs (smaller ones cost less to copy than to track)
STUB_BYTES = 256


def copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst`` but the field named ``skip``."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def nbytes(tensor: TensorProto) -> int:
    """Bytes of a tensor's values as stored (raw data, or its typed field), without decoding or copying them.

    Raw data is counted from the tensor's dims and element type: reading ``raw_data`` copies the bytes (a
    544 MB embedding took 0.6 s, and a 0.5B decoder's run read each weight's size thousands of times); a
    type without a fixed size (strings) is measured.
    """
    if tensor.HasField("raw_data"):
        size = _element_bytes(tensor.data_type)
        if size is None:
            return len(tensor.raw_data)
        count = int(np.prod(tensor.dims, dtype=np.int64)) if len(tensor.dims) else 1
        return (count + 1) // 2 if size == 0 else count * size
    return 4 * (len(tensor.float_data) + len(tensor.int32_data)) + 8 * (
        len(tensor.int64_data) + len(tensor.double_data) + len(tensor.uint64_data)
    )


#: element types stored two to a byte
_PACKED = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, n)}


def _element_bytes(data_type: int) -> Optional[int]:
    """Bytes of one element of ONNX type ``data_type`` in raw data: 0 for types packed two to a byte, None for
    types without a fixed size (strings) or unknown ones."""
    if data_type in _PACKED:
        return 0
    if data_type == TensorProto.STRING:
        return None
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    except (KeyError, ValueError, TypeError):
        return None


def raw_bytes(tensor: TensorProto) -> bytes:
    """A tensor's values as raw little-endian bytes: its ``raw_data``, or its typed field encoded."""
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    return bytes(numpy_helper.to_array(tensor).tobytes())


def is_stub(tensor: TensorProto) -> bool:
    """Whether ``tensor`` holds no values although its dims say it has some (a stub, or external data)."""
    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    return count > 0 and nbytes(tensor) == 0 and tensor.data_location != TensorProto.EXTERNAL


def stub_of(tensor: TensorProto) -> TensorProto:
    """A stub of ``tensor``: its name, type and dims, no values."""
    return TensorProto(name=tensor.name, data_type=tensor.data_type, dims=list(tensor.dims))


def weightless(
    model: onnx.ModelProto, keep: Optional[Callable[[TensorProto], bool]] = None
) -> tuple[onnx.ModelProto, Dict[str, TensorProto]]:
    """A copy of ``model`` whose top-level initializers of ``STUB_BYTES`` or more are stubs.

    Args:
        model: the model (not modified; its initializers are referenced, not copied).
        keep: initializers for which this returns True are copied whole whatever their size.

    Returns:
        (the copy, ``{stubbed initializer name: the model's own initializer}``). Bodies of
        If/Loop/Scan are copied whole. The copy is built field by field: no weight is copied.
    """
    out = onnx.ModelProto()
    copy_fields(model, out, "graph")
    g, src = out.graph, model.graph
    copy_fields(src, g, "initializer")
    stubbed: Dict[str, TensorProto] = {}
    for init in src.initializer:
        if nbytes(init) >= STUB_BYTES and not (keep is not None and keep(init)):
            g.initializer.append(stub_of(init))
            stubbed[init.name] = init
        else:
            g.initializer.append(init)
    return out, stubbed


#: elements converted at a time by ``float16_bytes`` (bounds its temporaries at about 100 MB)
FP16_CHUNK = 1 << 24


def float16_bytes(tensor: TensorProto, min_positive: float, max_finite: float) -> bytes:
    """An fp32 tensor's values as fp16 bytes, clipped as ONNX Runtime's float16 converter clips them
    (``onnxruntime.transformers.float16.convert_np_to_float16``: magnitudes under ``min_positive``
    to it, over ``max_finite`` to it, zeros and NaN/Inf kept), bit for bit.

    The converter's own function makes eight temporaries of the whole tensor and took 25 s for a
    2.8 GB model, numpy's cast 1.8 s a GB here; this rounds with ONNX Runtime's Cast (MLAS's
    vectorized conversion, the same round-to-nearest-even) ``FP16_CHUNK`` elements at a time and
    mends the few values rounding alone gives otherwise.
    """
    if tensor.HasField("raw_data") and tensor.data_type == TensorProto.FLOAT:
        values = np.frombuffer(tensor.raw_data, dtype=np.float32)
    else:
        values = numpy_helper.to_array(tensor).astype(np.float32, copy=False).ravel()
    return float16_of(values, min_positive, max_finite)


def float16_of(values: np.ndarray, min_positive: float, max_finite: float) -> bytes:
    """1-D fp32 ``values`` as fp16 bytes, clipped as ``float16_bytes`` clips them."""
    out = np.empty(values.size, dtype=np.float16)
    low, high = np.float16(np.float32(min_positive)), np.float16(max_finite)
    for start in range(0, values.size, FP16_CHUNK):
        part = values[start : start + FP16_CHUNK]
        half = _cast_float16(part)
        # rounding alone differs from the converter where a nonzero value became 0 (the converter gives
        # min_positive, whose fp16 is what every other value under it rounds to) and where a finite one
        # became inf (the converter gives max_finite; those in (max_finite, 65520) round to it already)
        bits = half.view(np.uint16) & 0x7FFF
        for lost, value in ((bits == 0, low), (bits == 0x7C00, high)):
            if np.count_nonzero(lost):
                where = np.flatnonzero(lost)
                where = where[np.isfinite(part[where]) & (part[where] != 0)]
                half[where] = np.copysign(value, part[where])
        out[start : start + half.size] = half
    return out.tobytes()


_cast_session: Any = None


def _cast_float16(values: np.ndarray) -> np.ndarray:
    """1-D fp32 ``values`` rounded to fp16 by ONNX Runtime's Cast on CPU (one session per process)."""
    global _cast_session
    if _cast_session is None:
        import onnxruntime as ort

        graph = onnx.helper.make_graph(
            [onnx.helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)],
            "cast",
            [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
            [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["n"])],
        )
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8)
        _cast_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(_cast_session.run(None, {"x": np.ascontiguousarray(values)})[0])


def bfloat16_bytes(values: np.ndarray) -> bytes:
    """fp32 values as bfloat16 bytes, rounded to nearest even (as ``conversion_repairs`` makes them)."""
    u32 = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return bytes((((u32 + 0x7FFF + ((u32 >> 16) & 1)) >> 16).astype(np.uint16)).tobytes())


def widened(tensor: TensorProto, values: bytes) -> bytes:
    """fp32 bytes of low-precision (fp16 or bf16) ``values`` stored with ``tensor``'s data type."""
    if tensor.data_type == TensorProto.FLOAT16:
        return bytes(np.frombuffer(values, np.float16).astype(np.float32).tobytes())
    if tensor.data_type == TensorProto.BFLOAT16:
        return bytes((np.frombuffer(values, np.uint16).astype(np.uint32) << 16).view(np.float32).tobytes())
    raise ValueError(f"not a low-precision type: {tensor.data_type}")


def fill(model: onnx.ModelProto, values: Callable[[TensorProto], Optional[bytes]], names: Iterable[str]) -> int:
    """Put values into the stubs named in ``names`` among ``model``'s top-level initializers, in place.

    Args:
        model: a model holding stubs.
        values: the raw little-endian bytes for a stub of its current data type, or None to leave it.
        names: the stubs to fill (others are left).

    Returns:
        How many stubs were filled.
    """
    wanted: Set[str] = set(names)
    filled = 0
    for init in model.graph.initializer:
        if init.name in wanted and is_stub(init):
            data = values(init)
            if data is not None:
                init.raw_data = data
                filled += 1
    return filled
