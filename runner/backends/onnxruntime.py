"""ONNX Runtime backend (CPU by default; providers and optimization level configurable)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from runner.backends.base import Backend
from runner.errors import ConfigError, ModelError, first_line
from runner.executors.slot import current
from runner.graph.activations import run_all_tensors
from runner.graph.sessions import session_for
from runner.graph.weight_file import weight_bytes

#: execution providers that run on one device chosen by their ``device_id`` option
GPU_PROVIDERS = frozenset(
    {
        "CUDAExecutionProvider",
        "TensorrtExecutionProvider",
        "ROCMExecutionProvider",
        "MIGraphXExecutionProvider",
        "DmlExecutionProvider",
    }
)

#: sessions of a model with this many bytes of weights are kept one at a time
CACHE_BYTES = 64 * 2**20

LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class OnnxRuntimeBackend(Backend):
    """Runs models with ONNX Runtime, keeping the last few sessions.

    Args:
        providers: execution providers in priority order, e.g. ``["CPUExecutionProvider"]``.
        graph_optimization_level: disable, basic, extended or all.
        cache_size: how many sessions to keep (keyed by model key); sessions of models holding
            ``CACHE_BYTES`` or more of weights together are not kept beside the newest (each holds
            its own copy of the weights: four sessions of a 212 MB decoder took 1.7 GB).
        provider_options: ``{provider: {option: value}}``, ONNX Runtime's provider options (e.g.
            ``{"CUDAExecutionProvider": {"cudnn_conv_algo_search": "HEURISTIC"}}``); options of a
            provider not in ``providers`` are unused. Values are passed as strings.
        cpu_arena: keep ONNX Runtime's CPU memory arena in each session (``runner.graph.sessions.session_for``);
            off for runs of models with every tensor marked as an output (``runner.layerwise``), whose
            arenas would keep all their values after each run.

    Raises:
        ConfigError: for an unknown optimization level, an unavailable provider, or provider
            options named for a provider ONNX Runtime does not know.
    """

    name = "onnxruntime"
    on_onnxruntime = True

    def __init__(
        self,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        graph_optimization_level: str = "all",
        cache_size: int = 4,
        provider_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
        cpu_arena: bool = True,
    ):
        if graph_optimization_level not in LEVELS:
            raise ConfigError(
                f"checker.graph_optimization_level={graph_optimization_level!r}; use one of {sorted(LEVELS)}"
            )
        missing = [p for p in providers if p not in ort.get_available_providers()]
        if missing:
            raise ConfigError(
                f"ONNX Runtime providers {missing} are not available here ({ort.get_available_providers()}); "
                "fix checker.providers"
            )
        unknown = sorted(set(provider_options or {}) - set(ort.get_all_providers()))
        if unknown:
            raise ConfigError(
                f"checker.provider_options names {unknown}, which ONNX Runtime does not know; "
                "use provider names such as CUDAExecutionProvider"
            )
        self.options = {p: {str(k): str(v) for k, v in (o or {}).items()} for p, o in (provider_options or {}).items()}
        self.providers = list(providers)
        self.level = LEVELS[graph_optimization_level]
        self.cache_size, self.cpu_arena = cache_size, bool(cpu_arena)
        self._sessions: OrderedDict[str, ort.InferenceSession] = OrderedDict()
        self._lock = threading.Lock()  # checks of a parallel run share the cache

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled without its sessions (a Dask worker makes its own)."""
        state = dict(self.__dict__)
        state["_sessions"], state["_lock"] = OrderedDict(), None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def providers_for(self, gpu: Optional[str]) -> List[Any]:
        """The providers a session gets in a check on GPU ``gpu`` (the running check's device, as
        ONNX Runtime numbers this process's GPUs; None: as configured): ``(name, options)`` pairs,
        each GPU provider with ``device_id=gpu`` added to its ``provider_options``."""
        chosen = []
        for p in self.providers:
            options = dict(self.options.get(p, {}))
            if gpu is not None and p in GPU_PROVIDERS:
                options["device_id"] = str(gpu)
            chosen.append((p, options) if options else p)
        return chosen

    def session(self, model: onnx.ModelProto, key: Optional[str]) -> ort.InferenceSession:
        """A (cached) session for ``model`` on the running check's GPU; safe to call from several threads."""
        gpu = current().device if any(p in GPU_PROVIDERS for p in self.providers) else None
        if key is not None and gpu is not None:
            key = f"{key}@gpu{gpu}"  # a session lives on one device
        with self._lock:
            if key is not None and key in self._sessions:
                self._sessions.move_to_end(key)
                return self._sessions[key]
        sess = session_for(model, self.providers_for(gpu), self.level, self.cpu_arena)
        if key is not None:
            large = weight_bytes(model) >= CACHE_BYTES
            with self._lock:
                if large:  # only the newest session of a large model stays
                    self._sessions.clear()
                self._sessions[key] = sess
                while len(self._sessions) > self.cache_size:
                    self._sessions.popitem(last=False)
        return sess

    def run(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        key: Optional[str] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        """Run once; intermediate ``outputs`` are served by a run with every tensor marked."""
        declared = [o.name for o in model.graph.output]
        if outputs is not None and not set(outputs) <= set(declared):
            values = run_all_tensors(model, feeds)
            return {n: values[n] for n in outputs}
        sess = self.session(model, key)
        names = list(outputs) if outputs is not None else [o.name for o in sess.get_outputs()]
        try:
            got = sess.run(names, dict(feeds))
        except Exception as e:
            raise ModelError(f"ONNX Runtime cannot run the model: {first_line(e)}") from None
        return {n: np.asarray(v) for n, v in zip(names, got)}

    def keep(self, models: int) -> None:
        """Hold at least ``models`` sessions (``cache_size`` raised, never lowered; the large-model rule stays)."""
        with self._lock:
            self.cache_size = max(self.cache_size, int(models))

    def close(self) -> None:
        """Drop cached sessions."""
        with self._lock:
            self._sessions.clear()
