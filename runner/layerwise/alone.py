"""Each node of a target model run alone on reference inputs: the runs behind introduced error.

A chunk's nodes go into isolated models (``runner.graph.isolate``: each node reads its inputs
from graph inputs fed the reference values), and those run on the target backend through an
executor's ``spread`` (``runner.executors.spread.spread``): with several lanes the nodes are split into
``2 * lanes`` models, interleaved in topological order so that each holds early and late nodes
alike, and the lanes take them as they free up; one more job, given by the caller, runs with them
(the whole target model's run: it then runs while other lanes run nodes alone).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend
from runner.errors import ModelError
from runner.executors.spread import HERE, RunHere, held, spread
from runner.graph.isolate import REF_SUFFIX, isolated_groups, isolated_model
from runner.graph.qdq import Chain, is_qdq
from runner.graph.weight_file import weight_file
from runner.layerwise.tensors import fed_value

log = logging.getLogger(__name__)

#: one model run on the target backend: (model, feeds, session cache key)
ModelJob = Tuple[onnx.ModelProto, Dict[str, np.ndarray], str]


def run_alone(backend: Backend, job: ModelJob) -> Tuple[Dict[str, np.ndarray], str]:
    """Run one model (a job of ``AloneRuns.run`` for ``runner.executors.spread.spread``, perhaps in a worker
    process): ``({output: value}, "")``, or ``({}, the backend's one-line error)`` when it cannot
    run the model (a ``ModelError``).

    Raises:
        RunHere: in a worker process, for a model whose weights are in the runner's weight file
            (the lane then runs the job in the runner).
    """
    model, feeds, key = job
    if not weight_file().holds(model):  # a large model's mapped copy reached a worker process
        raise RunHere("the model's weights are in the runner's weight file")
    try:
        return backend.run(model, feeds, key=key), ""
    except ModelError as e:
        return {}, str(e)


class AloneRuns:
    """Runs the nodes of ``target`` alone on the target backend.

    Args:
        target: the model as the target backend runs it.
        types: ``{tensor: ONNX elem type}`` of its tensors. weights: its weight tensor names.
        chains: its Q/DQ input chains (``runner.graph.qdq.input_chains``).
        backend: the target backend. lanes: where and how many at once (``Executor.lanes``).
        key: ``key(kind, what)`` -> a session cache key for a model of the comparison.
    """

    def __init__(
        self,
        target: onnx.ModelProto,
        types: Mapping[str, int],
        weights: Set[str],
        chains: Mapping[str, Chain],
        backend: Backend,
        key: Callable[[str, object], str],
        lanes: Sequence[Any] = HERE,
    ):
        self.target, self.types, self.weights, self.chains = target, types, weights, chains
        self.backend, self.key, self.lanes = backend, key, lanes or HERE
        self._models: Dict[Tuple[str, ...], onnx.ModelProto] = {}  # the chunk's isolated models
        self._shared: Any = backend  # the backend as the lanes' jobs share it (``on_lanes``)

    @contextlib.contextmanager
    def on_lanes(self) -> Iterator[None]:
        """For the ``with`` block, the backend is held in the lanes' worker processes (``executor=processes``,
        ``runner.executors.spread.held``): their sessions serve every chunk and sample, and are let go after."""
        with held(self.lanes, self.backend) as shared:
            self._shared = shared
            try:
                yield
            finally:
                self._shared = self.backend

    def clear(self) -> None:
        """Forget the isolated models built for the previous chunk."""
        self._models.clear()

    def fed(self, tensor: str) -> Optional[str]:
        """The tensor whose reference value feeds ``tensor`` when a node runs alone: the float tensor
        its Q/DQ pairs quantize, None for a quantized weight, else itself."""
        seen = set()
        while tensor in self.chains and tensor not in seen:
            seen.add(tensor)
            source = self.chains[tensor].source
            if source is None or source in self.weights:
                return None
            tensor = source
        return tensor

    def run(
        self, chunk: List[onnx.NodeProto], ref_value: Callable[[str], Optional[np.ndarray]], first: ModelJob
    ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray], Set[str]]:
        """Run ``first`` and every node of ``chunk`` alone, fed reference values.

        Args:
            chunk: the nodes (Q/DQ nodes run with the node that reads them).
            ref_value: a tensor's reference value, or None.
            first: a job run with them (the whole target model's run).

        Returns:
            ``first``'s outputs; every output of the nodes run alone; the inputs fed saturated
            (their reference values pass the isolated model's type). A group the backend cannot
            run, or lacking a reference value or type, is logged and left out.

        Raises:
            ModelError: the backend cannot run ``first``.
        """
        out: Dict[str, np.ndarray] = {}
        saturated: Set[str] = set()
        runnable, skipped = [], []
        for node in chunk:
            if is_qdq(node):
                continue  # run with the node that reads it
            reads = [self.fed(i) for i in node.input if i and i not in self.weights]
            if all(i is None or (ref_value(i) is not None and i in self.types) for i in reads):
                runnable.append(node)
            else:
                skipped.append(node.name)
        if skipped:
            log.warning(
                "No reference value or type for an input of %d nodes (e.g. %s); they are not run alone",
                len(skipped),
                skipped[0],
            )
        sizes: List[int] = []  # nodes of each job run alone, in the jobs' order
        groups = self._groups(runnable)
        # each job's session is built once, not again for each sample: on every device a lane may take it to
        devices = {lane.slot.device for lane in self.lanes}
        self.backend.keep((len(groups) + 1) * len(devices))
        jobs = itertools.chain([first], self._jobs(groups, ref_value, saturated, sizes))
        (whole, failed), *results = spread(self.lanes, run_alone, self._shared, jobs)
        if failed:
            raise ModelError(failed)
        for size, (got, error) in zip(sizes, results):
            if error:
                log.warning("The target backend cannot run %d nodes alone (%s); no introduced error", size, error)
            out.update(got)
        return whole, out, saturated

    def _groups(self, runnable: List[onnx.NodeProto]) -> List[List[onnx.NodeProto]]:
        """The groups of ``runnable`` nodes that run alone together: each of ``isolated_groups``
        split into ``2 * lanes`` interleaved parts (whole with one lane)."""
        parts = 1 if len(self.lanes) <= 1 else 2 * len(self.lanes)
        whole = isolated_groups(self.target, runnable)
        return [g[i::parts] for g in whole for i in range(min(parts, len(g)))]

    def _jobs(
        self,
        groups: List[List[onnx.NodeProto]],
        ref_value: Callable[[str], Optional[np.ndarray]],
        saturated: Set[str],
        sizes: List[int],
    ) -> Iterator[ModelJob]:
        """``run_alone``'s job for each of ``groups`` that can run alone, built as it is taken (its
        feeds are copies in the isolated model's types); the inputs fed saturated go into
        ``saturated`` and each job's node count into ``sizes``."""
        for group in groups:
            names = tuple(n.name for n in group)
            try:
                if names not in self._models:
                    self._models[names] = isolated_model(self.target, group, self.types, self.weights, self.chains)
                model = self._models[names]
            except KeyError as e:  # an outer-scope tensor of a body with no type
                log.warning("No type for tensor %s; %d nodes with subgraphs are not run alone", e, len(group))
                continue
            feeds: Dict[str, np.ndarray] = {}
            for vi in model.graph.input:
                tensor = vi.name[: -len(REF_SUFFIX)] if vi.name.endswith(REF_SUFFIX) else vi.name
                value = ref_value(tensor)
                if value is not None:
                    feeds[vi.name], clipped = fed_value(value, vi.type.tensor_type.elem_type)
                    if clipped:
                        saturated.add(tensor)
            if len(feeds) < len(model.graph.input):
                log.warning("No reference value for an outer-scope input of %d nodes; not run alone", len(group))
                continue
            sizes.append(len(group))
            yield model, feeds, self.key("alone", names)
