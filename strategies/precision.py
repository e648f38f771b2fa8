"""``mode=precision``: find the fewest nodes that must stay in fp32 for the check to pass.

Each candidate is the ONNX model converted to the low precision (fp16 or bf16) except a kept
set of nodes (``runner.graph.convert``); the same candidate runs on CPU through fp16 emulation
or is built strongly typed by TensorRT, and the final one is what the user deploys.

Markers:
    bisect / linear: Polygraphy's algorithm. Keep a prefix (``direction=forward``, from the
        network inputs) or a suffix (``reverse``, from the outputs) of the nodes in topological
        order, and search its length for the shortest that passes.
    minimal: a set search (``strategies.set_search``) over the nodes ranked by how far their
        fp32 values (activations and weights) reach past the low precision's range, ending with
        a 1-minimal kept set: dropping any one kept node fails the check.
"""
from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional

import numpy as np
import onnx
from hydra.utils import get_class

from runner.errors import CheckNeverPassedError, ConfigError
from runner.graph.activations import run_all_tensors
from runner.graph.constants import constants_to_initializers
from runner.graph.convert import convert_except, float_nodes, name_nodes
from runner.graph.feeds import check_input_shapes, model_feeds
from runner.graph.load import check_saved, load_model, save_model
from strategies.base import Candidate, Strategy, Verdict
from strategies.set_search import SetSearch

log = logging.getLogger(__name__)


def sensitivity_ranking(model: onnx.ModelProto, layers: List[int], values: Dict[str, np.ndarray]) -> List[int]:
    """Order ``layers`` by the largest magnitude among each node's outputs and weights, largest first.

    Args:
        model: the fp32 model (Constant nodes already initializers).
        layers: node indices to rank.
        values: fp32 values of the model's tensors (one reference run).

    Returns:
        ``layers`` reordered; nodes whose values pass the fp16 range (65504) come first, ties
        keep topological order.
    """
    inits = {t.name: t for t in model.graph.initializer}

    @functools.cache
    def peak(name: str) -> float:
        if name in values:
            arr = np.asarray(values[name])
        elif name in inits:
            arr = onnx.numpy_helper.to_array(inits[name])
        else:
            return 0.0
        if arr.size == 0 or arr.dtype.kind != "f":
            return 0.0
        finite = np.abs(arr[np.isfinite(arr)])
        return float(finite.max()) if finite.size else float("inf")

    score = {}
    for i in layers:
        node = model.graph.node[i]
        score[i] = max([peak(n) for n in list(node.output) + list(node.input) if n] or [0.0])
    return sorted(layers, key=lambda i: -score[i])  # stable: ties keep topological order


def _choice(value: Any) -> str:
    """An enum option's value; a plain string when the config came from a run's snapshot."""
    return str(getattr(value, "value", value))


class PrecisionStrategy(Strategy):
    """Searches for the kept (high-precision) node set.

    Args:
        model: the fp32 model, nodes named, Constant nodes as initializers.
        layers: indices of the nodes that can be kept, in topological order.
        marker_cls: BisectMarker, LinearMarker or MinimalMarker.
        direction: "forward" or "reverse" (prefix markers only).
        low: "float16" or "bfloat16".
        output: where the final mixed-precision model is written.
        ranking: the order for the minimal marker (default: topological).
        save_opts: ``external_data`` and ``threshold`` for ``save_model``.
    """

    def __init__(self, model: onnx.ModelProto, layers: List[int], marker_cls: type, direction: str = "forward",
                 low: str = "float16", output: Path = Path("mixed_precision.onnx"), ranking: Optional[List[int]] = None,
                 save_opts: Optional[Dict[str, Any]] = None):
        if not layers:
            raise ConfigError("the model has no float nodes to keep or convert; precision marking does not apply")
        self.model = model
        self.layers = list(layers)
        self.direction = direction
        self.low = low
        self.output = Path(output)
        self.save_opts = save_opts or {}
        self.marker_cls = marker_cls
        self.sets = bool(getattr(marker_cls, "searches_sets", False))
        self.order = list(ranking or layers) if self.sets else (self.layers if direction == "forward" else self.layers[::-1])
        self.fingerprint = hashlib.sha1("|".join(n.name for n in model.graph.node).encode()).hexdigest()[:8]
        self.phase = "all_high"
        self.search: Optional[SetSearch[int]] = None
        self.marker: Any = None
        self._pending: Optional[FrozenSet[int]] = None
        self._pending_index: Optional[int] = None
        self.final: Optional[FrozenSet[int]] = None
        self.weak_typing = False

    @classmethod
    def from_config(cls, cfg: Any) -> "PrecisionStrategy":
        """Load and prepare the model; rank nodes for the minimal marker.

        Raises:
            ModelError: bad model. ConfigError: unsupported precisions or options.
        """
        high, low = _choice(cfg.precision), _choice(cfg.low_precision)
        if high != "float32":
            raise ConfigError(f"precision={high}: keeping nodes in float16 needs a lower precision (int8/fp8) that this "
                              "tool does not convert to; use precision=float32 with low_precision=float16 or bfloat16")
        if low not in ("float16", "bfloat16"):
            raise ConfigError(f"low_precision={low}: use float16 or bfloat16")
        source = load_model(cfg.model)
        model = constants_to_initializers(name_nodes(source))
        layers = float_nodes(model)
        marker_cls = get_class(cfg.marker._target_)
        ranking, values = None, None
        if getattr(marker_cls, "searches_sets", False):
            shapes = check_input_shapes(source, cfg.model_input_shapes)
            values = run_all_tensors(model, model_feeds(source, shapes, cfg.inputs, cfg.seed))
            ranking = sensitivity_ranking(model, layers, values)
        checker = cfg.checker.get("backend") if "backend" in cfg.checker else None
        if checker == "onnxruntime" and list(cfg.checker.get("providers", [])) == ["CPUExecutionProvider"]:
            log.warning("ONNX Runtime on CPU computes fp16 models in fp32 where it lacks fp16 kernels and can hide "
                        "overflows; checker.backend=fp16_emulation shows them")
        strategy = cls(model, layers, marker_cls, _choice(cfg.direction), low, Path(cfg.output or "mixed_precision.onnx"), ranking,
                       {"external_data": cfg.external_data, "threshold": cfg.external_data_threshold})
        strategy.source_model = source
        strategy.activations = values  # the fp32 run of the ranking, reused by checker=compare
        if cfg.weak_typing:
            from runner.trt import load_tensorrt

            load_tensorrt("weak_typing=true")
            strategy.weak_typing = True
            strategy.artifact_suffix = ".engine"
        return strategy

    # -- candidates -----------------------------------------------------------------------

    def _candidate(self, kept: FrozenSet[int], label: str) -> Candidate:
        self._pending = kept
        names = sorted(self.model.graph.node[i].name for i in kept)
        key = f"{self.fingerprint}:{self.low}:" + hashlib.sha1(",".join(names).encode()).hexdigest()[:16]
        model = functools.cache(lambda: convert_except(self.model, names, self.low))

        def write(path: Path) -> None:
            if self.weak_typing:
                from runner.trt.weak_precision import build_weakly_typed

                path.write_bytes(build_weakly_typed(self.model.SerializeToString(), names, self.low))
            else:
                save_model(model(), path, **self.save_opts)

        return Candidate(key, f"{label}: {len(kept)} of {len(self.layers)} nodes in float32", write,
                         {"kept": len(kept), "total": len(self.layers)}, payload=None if self.weak_typing else model)

    def next_candidate(self) -> Optional[Candidate]:
        """All kept (must pass), none kept, then the marker's candidates."""
        if self.phase == "all_high":
            return self._candidate(frozenset(self.layers), "all nodes kept")
        if self.phase == "all_low":
            return self._candidate(frozenset(), "no node kept")
        if self.phase == "done":
            return None
        if self.sets:
            assert self.search is not None
            kept = self.search.next()
            if kept is None:
                self.final = self.search.result if self.search.result is not None else frozenset(self.layers)
                self.phase = "done"
                return None
            return self._candidate(kept, f"set search round {self.search.rounds + 1}")
        index = self.marker.next()
        if index is None:
            self.final = frozenset(self.order[: self.marker.boundary])
            self.phase = "done"
            return None
        self._pending_index = index
        return self._candidate(frozenset(self.order[:index]), f"{self.direction} prefix {index}")

    def take_verdict(self, candidate: Candidate, verdict: Verdict) -> None:
        """Advance the phase or feed the marker (target: the check passes)."""
        if self.phase == "all_high":
            if not verdict.passed:
                raise CheckNeverPassedError("the check fails even with every node in float32, so no kept set can pass; "
                                            "check the checker, its tolerances and the golden outputs",
                                            tail=verdict.details.get("output_tail", ""))
            self.phase = "all_low"
        elif self.phase == "all_low":
            if verdict.passed:
                self.final, self.phase = frozenset(), "done"
            else:
                self.phase = "search"
                if self.sets:
                    self.search = SetSearch(self.order, self.marker_cls)
                else:
                    self.marker = self.marker_cls(len(self.order))
        elif self.sets:
            assert self.search is not None
            self.search.step(verdict.passed)
        else:
            self.marker.step(self._pending_index, verdict.passed)

    def remaining(self) -> Optional[int]:
        """Checks left in the current phase or round."""
        if self.phase in ("all_high", "all_low"):
            return 2 if self.phase == "all_high" else 1
        if self.phase == "done":
            return 0
        return self.search.remaining() if self.search is not None else self.marker.remaining()

    def state(self) -> Dict[str, Any]:
        """The phase and, for the set search, the nodes found necessary so far."""
        found = sorted(self.search.required) if self.search is not None else []
        return {"phase": self.phase, "necessary": [self.model.graph.node[i].name for i in found]}

    def finish(self) -> None:
        """Write the final mixed-precision model and check it with onnx.checker."""
        assert self.final is not None
        names = [self.model.graph.node[i].name for i in sorted(self.final)]
        save_model(convert_except(self.model, names, self.low), self.output, **self.save_opts)
        check_saved(self.output)
        log.info("Mixed-precision model: %s (%d of %d nodes kept in float32)", self.output, len(self.final), len(self.layers))

    def result(self) -> Dict[str, Any]:
        """``kept_nodes`` (names and op types), ``kept``, ``total``, ``output`` for summary.json."""
        assert self.final is not None
        nodes = [self.model.graph.node[i] for i in sorted(self.final)]
        return {
            "kept_nodes": [{"name": n.name, "op": n.op_type} for n in nodes],
            "kept": len(nodes),
            "total": len(self.layers),
            "output": str(self.output),
            "marker": getattr(self.marker_cls, "__name__", str(self.marker_cls)),
            "direction": self.direction if not self.sets else "ranked",
            "low_precision": self.low,
        }
