"""The compare checker's golden values: one run of the original model on the reference backend."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.backends.base import make_backend, onnxruntime_options
from runner.graph.activations import run_all_tensors


def reference_run(
    reference: str,
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    providers: Sequence[str] = ("CPUExecutionProvider",),
    provider_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> Dict[str, np.ndarray]:
    """The values of one run of ``model`` on the backend named ``reference`` (``checker.reference``).

    Args:
        reference: "onnxruntime" (on CPU, optimizations off, every tensor kept), "onnx_reference"
            (``onnx.reference.ReferenceEvaluator``, every node output kept) or another backend's name
            (its graph outputs).
        feeds: ``{input name: array}``.
        providers, provider_options: ``checker.providers`` and ``checker.provider_options``, for a
            reference on ONNX Runtime other than "onnxruntime" itself.

    Returns:
        ``{tensor name: array}``: every tensor's value, or the graph outputs' where the backend gives no other.

    Raises:
        ModelError: the model cannot be loaded or run on the reference backend.
        MissingExtraError: a reference backend whose extra is not installed (tensorrt).
    """
    if reference == "onnxruntime":
        return run_all_tensors(model, dict(feeds))
    backend = make_backend(
        reference, **onnxruntime_options(reference, providers=list(providers), provider_options=provider_options)
    )
    try:
        names = [o for n in model.graph.node for o in n.output if o] if reference == "onnx_reference" else None
        return backend.run(model, feeds, outputs=names)
    finally:
        backend.close()
