"""The backend interface: run a model on a set of inputs, return its outputs by name."""

from __future__ import annotations

import abc
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx


class Backend(abc.ABC):
    """Runs ONNX models. One module per backend in ``runner/backends/``.

    Subclasses may cache per-model state (sessions, engines) keyed by the ``key`` argument.
    """

    #: the name used in config (``checker.backend=NAME``)
    name: str = ""

    @abc.abstractmethod
    def run(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        key: Optional[str] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        """Run ``model`` once.

        Args:
            model: the model to run.
            feeds: ``{input name: array}`` for every graph input.
            key: identity of the model for caching (same key = same model), or None.
            outputs: names of tensors to return (graph outputs by default; intermediate tensor
                names are allowed where the backend supports it).

        Returns:
            ``{output name: array}``.

        Raises:
            runner.errors.ModelError: when the backend cannot load or run the model.
        """

    def close(self) -> None:
        """Release cached sessions or engines."""


#: config name -> (class path, fixed keyword arguments); a new backend is one more entry
BACKENDS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "onnxruntime": ("runner.backends.onnxruntime.OnnxRuntimeBackend", {}),
    "onnx_reference": ("runner.backends.onnx_reference.OnnxReferenceBackend", {}),
    "fp16_emulation": ("runner.backends.fp16_emulation.EmulationBackend", {}),
    "bf16_emulation": ("runner.backends.fp16_emulation.EmulationBackend", {}),  # the same: rounds each type to itself
    "tensorrt": ("runner.backends.tensorrt.TensorRTBackend", {}),
}


def make_backend(name: str, **options) -> Backend:
    """Build a backend by its config name (a key of ``BACKENDS``).

    Args:
        name: onnxruntime, onnx_reference, fp16_emulation, bf16_emulation or tensorrt.
        options: ONNX Runtime options (providers, graph_optimization_level), passed to backends
            that run on ONNX Runtime and ignored by the others.

    Raises:
        runner.errors.ConfigError: for an unknown name.
        runner.errors.MissingExtraError: for tensorrt when TensorRT is not installed.
    """
    import inspect

    from hydra.utils import get_class

    from runner.errors import ConfigError

    if name not in BACKENDS:
        raise ConfigError(f"checker backend {name!r} is unknown; use one of {sorted(BACKENDS)}")
    path, fixed = BACKENDS[name]
    cls = get_class(path)
    accepted = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted}
    return cls(**fixed, **kwargs)
