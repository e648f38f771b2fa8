"""The compare checker's golden values: one run of the original model on the reference backend."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.backends.base import make_backend, onnxruntime_options
from runner.graph.activations import run_all_tensors, run_tensors_each

log = logging.getLogger(__name__)

#: seconds between the progress lines of golden values made for many samples
PROGRESS_S = 5.0


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


def reference_samples(
    reference: str,
    model: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    names: Optional[Sequence[str]],
    providers: Sequence[str] = ("CPUExecutionProvider",),
    provider_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> List[Dict[str, np.ndarray]]:
    """Each sample's golden values, with its feeds: every tensor's (``names`` None, as ``reference_run``), else only
    ``names``' (on ONNX Runtime from one session over all the samples; another reference keeps what it gives). A
    run over many samples says how far it got every ``PROGRESS_S`` seconds.

    Args:
        reference, providers, provider_options: as ``reference_run``.
        model: the fp32 model.
        samples: ``{input name: array}`` each.
        names: the tensors to keep (a check's compared outputs), or None for all.

    Returns:
        One ``{tensor name: array}`` per sample, its feeds included.

    Raises:
        ModelError: the model cannot be loaded or run on the reference backend.
    """
    each: Iterator[Dict[str, np.ndarray]] = (
        run_tensors_each(model, samples, names)
        if names is not None and reference == "onnxruntime"
        else (reference_run(reference, model, feeds, providers, provider_options) for feeds in samples)
    )
    made: List[Dict[str, np.ndarray]] = []
    start = last = time.monotonic()
    for feeds, values in zip(samples, each):
        made.append({**{k: np.asarray(v) for k, v in feeds.items()}, **values})
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            log.info("Golden values: %d of %d samples in %.0f s", len(made), len(samples), last - start)
    return made
