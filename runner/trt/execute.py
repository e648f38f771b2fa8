"""Run a serialized TensorRT engine on numpy inputs (device memory through cuda-python)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np
import tensorrt as trt

from runner.errors import ConfigError, MissingExtraError, ModelError


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError:
            raise MissingExtraError("cuda-python", "trt", "running TensorRT engines") from None
    return cudart


def _ok(result: Any) -> Any:
    err = result[0]
    if int(err) != 0:
        raise ModelError(f"CUDA call failed: {err}")
    return result[1] if len(result) > 1 else None


def use_device(gpu: Optional[str]) -> None:
    """Make GPU ``gpu`` (a running check's slot, from ``executor.gpus``) this thread's CUDA device,
    where TensorRT then builds and runs; None leaves the thread's device as it is.

    Raises:
        ConfigError: when ``gpu`` is not a device number (a UUID works only through
            ``CUDA_VISIBLE_DEVICES``, i.e. for command checks).
        ModelError: when CUDA cannot select the device. MissingExtraError: without cuda-python.
    """
    if gpu is None:
        return
    try:
        device = int(gpu)
    except ValueError:
        raise ConfigError(
            f"executor.gpus holds {gpu!r}: in-process TensorRT work needs device numbers (0, 1, ...)"
        ) from None
    _ok(_cudart().cudaSetDevice(device))


def run_engine(engine_bytes: bytes, feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Deserialize ``engine_bytes``, run it once on ``feeds``, return every output.

    Raises:
        ModelError: when the engine cannot be deserialized or run, or an input is missing.
        MissingExtraError: when cuda-python is not installed.
    """
    cudart = _cudart()
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_bytes)
    if engine is None:
        raise ModelError("TensorRT could not deserialize the engine")
    context = engine.create_execution_context()
    stream = _ok(cudart.cudaStreamCreate())
    buffers: Dict[str, int] = {}
    outputs: Dict[str, np.ndarray] = {}
    try:
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                if name not in feeds:
                    raise ModelError(f"no value for engine input {name!r}")
                array = np.ascontiguousarray(feeds[name], dtype=trt.nptype(engine.get_tensor_dtype(name)))  # type: ignore[no-untyped-call]
                context.set_input_shape(name, tuple(array.shape))
                buffers[name] = _ok(cudart.cudaMalloc(max(array.nbytes, 1)))
                _ok(
                    cudart.cudaMemcpy(
                        buffers[name], array.ctypes.data, array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
                    )
                )
                context.set_tensor_address(name, buffers[name])
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:
                dims = context.get_tensor_shape(name)
                shape = tuple(dims[i] for i in range(len(dims)))
                outputs[name] = np.empty(shape, dtype=trt.nptype(engine.get_tensor_dtype(name)))  # type: ignore[no-untyped-call, arg-type]
                buffers[name] = _ok(cudart.cudaMalloc(max(outputs[name].nbytes, 1)))
                context.set_tensor_address(name, buffers[name])
        if not context.execute_async_v3(int(stream)):
            raise ModelError("TensorRT failed to execute the engine")
        for name, array in outputs.items():
            _ok(
                cudart.cudaMemcpyAsync(
                    array.ctypes.data, buffers[name], array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream
                )
            )
        _ok(cudart.cudaStreamSynchronize(stream))
    finally:
        for ptr in buffers.values():
            cudart.cudaFree(ptr)
        cudart.cudaStreamDestroy(stream)
    return outputs
