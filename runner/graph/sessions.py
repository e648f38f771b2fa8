"""ONNX Runtime sessions for models in memory: weights mapped from the weight file for large models
(``runner.graph.weight_file``), the protobuf string for others, a temporary file past 2 GB."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import onnx
import onnxruntime as ort

from runner.errors import ModelError, first_line
from runner.graph.device_weights import DeviceWeights, device_of, device_weights
from runner.graph.load import as_file, is_large, load_model
from runner.graph.weight_file import is_mapped, maps, remove_file, weight_bytes, weight_file

#: session options every session of the tool takes: ONNX Runtime's intra-op threads block instead of
#: spinning between a run's operators. A spinning pool serves a server's latency; here runs are short and
#: sit beside the tool's own threads, other sessions (``executor=local``), check programs and worker
#: processes, whose cores a spinning pool burns: the tests on 2 cores with 2 workers took 39-40 s
#: spinning and 32-33 s not, a serial precision run of the detector 4.5 s and 3.9-4.0 s, and a run alone
#: on the machine the same either way (benchmarks/README.md, "ONNX Runtime's threads")
SESSION_CONFIG = {"session.intra_op.allow_spinning": "0"}


@contextmanager
def session_file(
    model: Union[onnx.ModelProto, Path], options: Any, device: Optional[DeviceWeights] = None
) -> Iterator[Union[str, bytes]]:
    """What to give ``onnxruntime.InferenceSession`` for ``model``, for the ``with`` block.

    A model with ``MAP_BYTES`` or more of weights, or one already mapped: the path of a mapped copy
    in the weight file's folder (removed after the block), and ``options`` (an
    ``onnxruntime.SessionOptions``) told to skip what copies weights: MatMul weight pre-packing,
    constant folding (a folded Cast or Transpose of a weight), level "all"'s layout transforms (the
    level drops to "extended"), and the CPU arena (it keeps the largest set of weights' Casts a run
    made). Otherwise (or when the weight file cannot be written) the model itself: its path, its
    protobuf string, or a temporary file past 2 GB.

    Args:
        model: a model file, or a model in memory (not modified).
        options: the session's options; changed as said above.
        device: the weights kept on the session's GPU (``runner.graph.device_weights``): a mapped model's
            session takes its weights from there, and they are kept there for later sessions.

    Raises:
        ArtifactError: when a model of 1 GB or more cannot be written to a temporary file.
    """
    if isinstance(model, Path):
        yield str(model)
        return
    if is_mapped(model) or maps(weight_bytes(model)):
        weights = weight_file()
        mapped = model if is_mapped(model) else weights.mapped(model)
        path = weights.model_path(mapped) if mapped is not None else None
        if path is not None:
            options.add_session_config_entry("session.disable_prepacking", "1")
            # folding a Cast or Transpose of a weight makes a copy of it in memory, as do the layout
            # transforms of level "all"; the arena would keep the largest set of weights' Casts for good
            options.add_session_config_entry("optimization.disable_specified_optimizers", "ConstantFolding")
            if options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL:
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            options.enable_cpu_mem_arena = False
            if device is not None and mapped is not None:
                device.share(mapped, options)
            try:
                yield str(path)
            finally:
                remove_file(path)
            return
        if is_mapped(model):  # the session file cannot be written: the model gets its values back
            model = weights.with_values(model)
    if is_large(model):
        with as_file(model) as path:
            yield str(path)
    else:
        yield model.SerializeToString()


def session_for(
    model: onnx.ModelProto,
    providers: Sequence[Any] = ("CPUExecutionProvider",),
    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    cpu_arena: bool = True,
    keep_on_device: bool = True,
) -> ort.InferenceSession:
    """An ONNX Runtime session for an in-memory model.

    A model with ``MAP_BYTES`` or more of weights (or one already mapped) gets a session that maps
    its weights from this process's weight file instead of copying them (``session_file``); on the CUDA
    provider it takes those that earlier sessions copied to the GPU from there (``keep_on_device``).

    Args:
        model: the model.
        providers: names, or ``(name, options)`` pairs (e.g. ``("CUDAExecutionProvider", {"device_id": "1"})``).
        level: ONNX Runtime's graph optimization level.
        cpu_arena: keep ONNX Runtime's CPU memory arena (``SessionOptions.enable_cpu_mem_arena``). The
            arena keeps the most memory any run of the session took until the session is dropped: off
            for models with every tensor marked as an output, whose runs hold all their values at once.
        keep_on_device: on the CUDA provider, a mapped model's weights are kept on the GPU for later
            sessions, and taken from there (``runner.graph.device_weights``); False reads them all from the
            weight file.

    Every session takes ``SESSION_CONFIG`` (its threads do not spin).

    Raises:
        ModelError: when ONNX Runtime rejects the model.
    """
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.enable_cpu_mem_arena = cpu_arena
    opts.log_severity_level = 3
    for key, value in SESSION_CONFIG.items():
        opts.add_session_config_entry(key, value)
    try:
        where = device_of(providers) if keep_on_device else None
        kept = device_weights(*where) if where is not None else None
        with session_file(model, opts, kept) as source:
            return ort.InferenceSession(source, opts, providers=list(providers))
    except Exception as e:  # onnxruntime raises its own exception types
        raise ModelError(f"ONNX Runtime cannot load the model: {first_line(e)}") from None


def loads_on_cpu(model: Path | onnx.ModelProto) -> Optional[str]:
    """None when ONNX Runtime on CPU creates a session for ``model`` (a model file, or a model under
    2 GB in memory), else why not (starting "no CPU kernel" when only a kernel is missing, e.g.
    bfloat16 ops)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        if not isinstance(model, onnx.ModelProto) and maps(Path(model).stat().st_size):
            model = load_model(model)  # a session from the file would hold two more copies of its weights
        with session_file(model, options) as source:
            ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        first = " ".join(str(e).split())[:300]
        if type(e).__name__ == "NotImplemented" or "NOT_IMPLEMENTED" in first:
            return f"no CPU kernel: {first}"
        return first
    return None
