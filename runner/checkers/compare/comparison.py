"""How ``checker=compare`` runs and judges a model, for the work beside its checks that must do the same.

Layerwise's comparison, reduce's own runs of the original and precision's rankings run models as the
compare checker runs candidates and judge them by its tolerances. They read this record
(``Checker.comparison``) instead of reaching into the checker: a checker that compares nothing gives
None, and the work that needs one says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend, make_backend, onnxruntime_options
from runner.checkers.compare.tolerance import Tolerances
from runner.lowp.precisions import LowPrecision

#: what sessions made for an order (precision's rankings) use on the CUDA provider, whatever the checks use:
#: cuDNN's default convolution algorithm, no search. A ranking is an order, not a verdict, and every one of
#: its sessions runs a few times: on the detector a session's first run costs about 5 s with cuDNN's
#: exhaustive search, 1.1-5.5 s with its heuristic, about 0.2 s with the default (benchmarks/README.md,
#: "GPU checks" and "Two GPUs"), paid by every chunk of the ranking in every process that runs it.
ORDER_PROVIDER_OPTIONS: Dict[str, Dict[str, str]] = {"CUDAExecutionProvider": {"cudnn_conv_algo_search": "DEFAULT"}}


def order_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    """ONNX Runtime's options (``providers``, ``provider_options``, ...) for runs that make an order:
    ``ORDER_PROVIDER_OPTIONS`` over the options of each of its providers that is among ``providers``;
    the others as they are."""
    made = dict(options)
    providers = set(made.get("providers") or ())
    if providers & set(ORDER_PROVIDER_OPTIONS):
        merged = {p: dict(o) for p, o in (made.get("provider_options") or {}).items()}
        for provider, values in ORDER_PROVIDER_OPTIONS.items():
            if provider in providers:
                merged.setdefault(provider, {}).update(values)
        made["provider_options"] = merged
    return made


def on_device(backend: str, providers: Sequence[str]) -> bool:
    """Whether a checker backend runs candidates on a device (TensorRT, or ONNX Runtime with a GPU
    execution provider) rather than on the CPU."""
    from runner.backends.onnxruntime import GPU_PROVIDERS

    return backend == "tensorrt" or (backend == "onnxruntime" and any(p in GPU_PROVIDERS for p in providers))


@dataclass(frozen=True)
class Comparison:
    """The compare checker's way of running and judging, as data.

    Attributes:
        backend_name: the backend candidates run on (``checker.backend``).
        backend_options: the ONNX Runtime options it was made with (providers, optimization level, ...).
        providers: its ONNX Runtime providers.
        reference_name: the backend golden values come from (``checker.reference``).
        low: the low precision an fp32 candidate is run in (``checker.low_precision`` or the emulation's),
            or None.
        rule: the tolerances outputs are judged by.
        exclude_outputs: graph outputs left out of the judgement.
        samples: the input samples with their golden values, once the checker is bound (``bind``).
        as_run: how the checker runs an fp32 model when that is not as written (``CompareChecker.as_run``).
    """

    backend_name: str
    backend_options: Mapping[str, Any]
    providers: Tuple[str, ...]
    reference_name: str
    low: Optional[LowPrecision]
    rule: Tolerances
    exclude_outputs: FrozenSet[str] = field(default_factory=frozenset)
    samples: Callable[[], List[Dict[str, np.ndarray]]] = list
    as_run: Optional[Callable[[onnx.ModelProto], Optional[Tuple[onnx.ModelProto, str]]]] = None

    @property
    def on_device(self) -> bool:
        """Whether candidates run on a device (TensorRT, or a GPU provider of ONNX Runtime)."""
        return on_device(self.backend_name, self.providers)

    def backend(self, for_order: bool = False) -> Backend:
        """A new backend like the checker's own (the same name and ONNX Runtime options) for a comparison
        whose models have every tensor marked: on ONNX Runtime its sessions keep no CPU memory arena,
        which would hold all the values of a run after it. The caller closes it.

        Args:
            for_order: the runs make an order (a ranking), not a verdict: on ONNX Runtime with the CUDA
                provider, ``ORDER_PROVIDER_OPTIONS`` replace the checks' own choice.

        Raises:
            MissingExtraError: the backend is TensorRT and TensorRT is not installed.
        """
        options = order_options(self.backend_options) if for_order else dict(self.backend_options)
        extra = onnxruntime_options(self.backend_name, cpu_arena=False)
        return make_backend(self.backend_name, **options, **extra)
