"""Rank candidates by the error each makes at the model's outputs: the model with one node alone in
the low precision, run whole on the samples and compared with the fp32 run.

Where error adds up over many nodes (int8 under ONNX Runtime's CPU placement: most nodes of a
detector needed), the error a node introduces at its own output (``runner.layerwise.ranking``) says
little about what reaches the outputs: a node before a normalization or a saturating activation
loses its error, one before a wide fan-out spreads it. Ranking by the output error of each node
alone is the layer sensitivity analysis of post-training quantization tools (one model run per
node). On the detector held to rel L2 0.05 on its text map (ONNX Runtime placement, 4 rendered
pages) the shortest passing prefix of this ranking holds 165 of 330 nodes, of the introduced-error
ranking 232 (``benchmarks/README.md``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import onnx

from runner.backends.base import Backend, make_backend
from runner.errors import ModelError
from runner.executors.spread import HERE, spread
from runner.lowp.switchboard import Switchboard

log = logging.getLogger(__name__)

#: seconds between the ranking's progress lines
PROGRESS_S = 15.0

T = TypeVar("T", bound=Hashable)


def output_error(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    """Relative L2 error of ``got`` against ``want`` over every output together: ``||got - want|| /
    ||want||`` (``||got - want||`` where ``want`` is all zeros); inf for a missing output, a shape
    that differs (a decision output that kept other rows) or a value that is not finite."""
    diff = norm = 0.0
    for name, ref in want.items():
        out = got.get(name)
        if out is None or np.shape(out) != np.shape(ref):
            return math.inf
        a, b = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        if not np.all(np.isfinite(a)):
            return math.inf
        diff += float(np.sum((a - b) ** 2))
        norm += float(np.sum(b**2))
    return math.sqrt(diff / norm) if norm > 0 else math.sqrt(diff)


#: runs a ranking makes before it projects its own time against an allowance (``output_error_ranking``)
PACE_AFTER = 3


class RankingAbandoned(Exception):
    """A ranking given an allowance stopped because its runs would take longer (``output_error_ranking``).

    Attributes:
        done: runs made before it stopped.
        total: runs it had to make.
        seconds: seconds it took until it stopped (the reference's runs included).
    """

    def __init__(self, done: int, total: int, seconds: float):
        super().__init__(f"{done} of {total} runs in {seconds:.1f} s")
        self.done, self.total, self.seconds = done, total, seconds


#: what ranks one item: the model with it alone in the low precision, or a switchboard and that
#: candidate's switch feeds (``runner.lowp.switchboard``: one session for every item)
Made = Union[onnx.ModelProto, Tuple[Switchboard, Mapping[str, np.ndarray]]]


def output_error_ranking(
    candidates: Sequence[Tuple[T, Callable[[], Made]]],
    reference: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    backend: Optional[Backend] = None,
    lanes: Sequence[Any] = HERE,
    built: Optional[Callable[[T], onnx.ModelProto]] = None,
    allowance: Optional[float] = None,
) -> List[T]:
    """The items of ``candidates`` ordered by their candidate's output error (``output_error``, the
    largest over the samples), largest first; ties keep the given order.

    Args:
        candidates: ``(item, build)`` pairs; ``build()`` makes the model with the item alone in the
            low precision, or gives a switchboard and the feeds of that candidate's switches.
        reference: the fp32 model whose outputs the candidates are compared with.
        samples: input feed dicts (each candidate runs on all of them).
        backend: runs the models (the checker's device backend, ``ranking_backend``); None: ONNX Runtime
            on CPU. Closed at the end either way.
        lanes: where the candidates run (``Executor.lanes``, ``runner.executors.spread``): with several,
            one thread per lane takes the next candidate as it frees up, each on its lane's GPU.
        built: makes an item's candidate model, for a switched one whose switchboard run fails (the switchboard's
            failure, e.g. a device's memory, is not the candidate's: said once, and from then on every candidate is
            built); None: such a candidate ranks first.
        allowance: seconds the ranking may take (a budget's share), or None: no limit. After ``PACE_AFTER`` runs,
            and before each later one, it projects its end at its pace so far (a switched run may take a tenth of a
            built one's time, so no pace is known before the runs) and stops when that is past the allowance; with
            0, before any run.

    Returns:
        The items, most output error first. A candidate that cannot be built or run ranks first (its
        node cannot be in the low precision alone).

    Raises:
        RankingAbandoned: its runs would take more than ``allowance``.

    Cost: one model build (none when switched) and ``len(samples)`` runs per candidate, plus the
    reference's runs; spread over the lanes.
    """
    backend = backend or make_backend("onnxruntime", cpu_arena=False)
    started = time.monotonic()
    progress = {"said": started, "done": 0, "finished": 0, "first": started}
    lock = threading.Lock()
    board_failed = threading.Event()  # a switched run failed: every candidate is built from then on
    abandoned = threading.Event()  # past the allowance: the runs left are not made

    def over(now: float) -> bool:
        """Whether the ranking's projected end is past ``allowance``: the time so far, and the runs left at the
        pace of those after the first (the first pays once for the reference's runs, a switched model's session
        and a device's warm-up: 7 s for a 0.5B decoder's switched model on an H200, then 0.15 s a run)."""
        finished = progress["finished"]
        if allowance is not None and allowance <= 0:
            return True
        if allowance is None or finished < min(PACE_AFTER, len(candidates)):
            return False
        pace = (now - progress["first"]) / max(finished - 1, 1)
        return now - started + pace * (len(candidates) - finished) > allowance

    def error(wanted: List[Dict[str, np.ndarray]], job: Tuple[T, Callable[[], Made]]) -> float:
        item, build = job
        with lock:
            if abandoned.is_set() or over(time.monotonic()):
                abandoned.set()
                return math.nan
            progress["done"] += 1
            if time.monotonic() - progress["said"] >= PROGRESS_S:
                progress["said"] = time.monotonic()
                log.info(
                    "Ranking by output error: %d of %d, %.0f s",
                    progress["done"],
                    len(candidates),
                    progress["said"] - started,
                )
        try:
            return ranked_error(item, build, wanted)
        finally:
            with lock:
                progress["finished"] += 1
                if progress["finished"] == 1:
                    progress["first"] = time.monotonic()

    def ranked_error(item: T, build: Callable[[], Made], wanted: List[Dict[str, np.ndarray]]) -> float:
        try:
            made = build() if not board_failed.is_set() or built is None else built(item)
            try:
                return _largest_error(backend, made, f"rank:{item}", samples, wanted)
            except ModelError as e:
                if isinstance(made, onnx.ModelProto) or built is None:
                    raise
                with lock:
                    if not board_failed.is_set():
                        board_failed.set()
                        log.warning(
                            "Ranking: the switched model cannot run the candidate of %s (%s); it and the rest are "
                            "built and run instead",
                            item,
                            e,
                        )
                return _largest_error(backend, built(item), f"rank:{item}", samples, wanted)
        except ModelError as e:
            log.info("Ranking: the candidate of %s cannot run (%s); it ranks first", item, e)
            return math.inf

    try:
        wanted: List[Dict[str, np.ndarray]] = [backend.run(reference, feeds, key="rank:reference") for feeds in samples]
        errors = spread(lanes, error, wanted, candidates)
    finally:
        backend.close()
    if abandoned.is_set():
        raise RankingAbandoned(int(progress["done"]), len(candidates), time.monotonic() - started)
    order = sorted(range(len(candidates)), key=lambda p: -errors[p])  # stable: ties keep the given order
    return [candidates[p][0] for p in order]


def _largest_error(
    backend: Backend,
    made: Made,
    key: str,
    samples: Sequence[Mapping[str, np.ndarray]],
    wanted: Sequence[Mapping[str, np.ndarray]],
) -> float:
    """The largest ``output_error`` over ``samples`` of the candidate ``made`` (a model, session key ``key``; or a
    switchboard and its feeds) against ``wanted``.

    Raises:
        ModelError: the backend cannot run it.
    """
    if isinstance(made, onnx.ModelProto):
        model, switches = made, {}
    else:
        model, switches, key = made[0].model, dict(made[1]), made[0].key
    runs = (backend.run(model, {**feeds, **switches}, key=key) for feeds in samples)
    return max(output_error(got, want) for got, want in zip(runs, wanted))
