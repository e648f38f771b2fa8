"""The backend interface: run a model on a set of inputs, return its outputs by name."""

from __future__ import annotations

import abc
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Type

import numpy as np
import onnx


class Backend(abc.ABC):
    """Runs ONNX models. One module per backend in ``runner/backends/``.

    Subclasses may cache per-model state (sessions, engines) keyed by the ``key`` argument.
    """

    #: the name used in config (``checker.backend=NAME``)
    name: str = ""

    #: runs on ONNX Runtime: takes ``providers``, ``graph_optimization_level`` and ``provider_options``
    on_onnxruntime: bool = False

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

    def keep(self, models: int) -> None:
        """Keep the state of at least ``models`` models at once (sessions, rewritten models), for a caller
        that cycles through that many keyed models, e.g. a layerwise comparison's jobs on each sample:
        with fewer kept, every sample would build each one again. Nothing here (no cache)."""

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


def backend_class(name: str) -> Type[Backend]:
    """The class of the backend named ``name`` in config (imported, not built).

    Raises:
        runner.errors.ConfigError: for an unknown name.
    """
    from hydra.utils import get_class

    from runner.errors import ConfigError

    if name not in BACKENDS:
        raise ConfigError(f"checker backend {name!r} is unknown; use one of {sorted(BACKENDS)}")
    cls: Type[Backend] = get_class(BACKENDS[name][0])
    return cls


def onnxruntime_options(name: str, **options: Any) -> Dict[str, Any]:
    """``options`` (ONNX Runtime's: providers, graph_optimization_level, provider_options) when the
    backend ``name`` runs on ONNX Runtime, else none: for internal callers that pass the run's
    ONNX Runtime settings to whichever backend the user chose."""
    return dict(options) if backend_class(name).on_onnxruntime else {}


def make_backend(name: str, **options: Any) -> Backend:
    """Build a backend by its config name (a key of ``BACKENDS``).

    Args:
        name: onnxruntime, onnx_reference, fp16_emulation, bf16_emulation or tensorrt.
        options: keyword arguments of the backend's constructor (ONNX Runtime's options for the
            backends whose ``on_onnxruntime`` is True; ``onnxruntime_options`` picks them).

    Raises:
        runner.errors.ConfigError: for an unknown name, or an option the backend does not take.
        runner.errors.MissingExtraError: for tensorrt when TensorRT is not installed.
    """
    import inspect

    from runner.errors import ConfigError

    cls = backend_class(name)
    unknown = sorted(set(options) - set(inspect.signature(cls).parameters))
    if unknown:
        raise ConfigError(f"checker.backend={name} takes no {', '.join(unknown)}; drop the checker key(s) setting them")
    return cls(**BACKENDS[name][1], **options)
