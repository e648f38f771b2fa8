"""The compare checker's switched runs: precision's candidates on their search's switchboard.

A candidate carrying ``Candidate.switched`` is run as one feed set of its search's switched model
(``runner.lowp.switchboard``), in one cached session, instead of being built, validated and loaded
in a session of its own. That gives the candidate's own values only where the checker's backend runs
the candidate as written with graph optimizations off: fp16 and bf16 candidates (``runner.lowp.fp16_switchboard``)
under ``checker.backend=fp16_emulation`` or ``bf16_emulation`` on the CPU provider, whose rounding Casts the
switched model holds; int8 candidates with TensorRT's placement (``runner.lowp.qdq_switchboard``) under
``checker.backend=onnxruntime`` on the CPU provider, whose Q/DQ it holds; fp16 and bf16 candidates under
``checker.backend=onnxruntime`` on a device's provider (CUDA's), on the native switchboard whose converted nodes
run on the device's own low-precision kernels (``Switchboard``'s ``RunsOn`` says which). Graph optimizations
are off by default for the emulations and int8; for a device, ``checker.graph_optimization_level=disable`` turns
switched runs on (at "all" ONNX Runtime fuses nodes across a candidate's, which a switched model cannot). The
checker must compare graph outputs (all of them, those ``checker.exclude_outputs`` leaves, or ``checker.outputs``
and detection tensors that are graph outputs: the switched model marks no intermediate tensor). The first
``CROSS_CHECKS`` switched candidates that keep some switched nodes and convert others (not the gates: with every
switch one way a switched model is the model or its whole conversion), and one in every ``SPOT_EVERY`` switched
candidates after them, are also built and run as themselves; an output that differs by one bit turns switched runs
off for the rest of the run, with a warning. Verdicts the search took from the switched model before then stay
taken: the summary then says ``minimal: false`` and why (``switched_disagreed``), and the answer is checked as
written as always.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend
from runner.backends.fp16_emulation import EmulationBackend
from runner.backends.onnxruntime import OnnxRuntimeBackend
from runner.candidates import Candidate
from runner.errors import ModelError
from runner.lowp.switchboard import RunsOn, Switchboard

log = logging.getLogger(__name__)

#: switched candidates also built and run as themselves, to show that both give the same bits
CROSS_CHECKS = 2
#: after them, one switched candidate in this many is built and run as itself again (a switched model that is
#: wrong only for some kept sets: a Qwen2 export's Casts to fp32 were, until they were switched too)
SPOT_EVERY = 32


class SwitchedRuns:
    """Whether and how the compare checker runs a candidate on its switchboard.

    Args:
        backend: the checker's candidate backend: an emulation runs fp16/bf16 switchboards (on CPU), ONNX
            Runtime int8 ones on CPU and fp16/bf16 native ones on a device, any other none.
        enabled: ``checker.switchboard``.
        cpu_only: the backend runs on ONNX Runtime's CPU provider alone (else on a device's).
        level: the backend's graph optimization level (switched runs need "disable").
        named: the tensors the checker names to compare (``checker.outputs``, detection tensors):
            switched runs stay on only if each is a graph output of the model (``bind``).
        cross_checks: how many switched candidates are also built and run as themselves.
    """

    def __init__(
        self,
        backend: Backend,
        enabled: bool,
        cpu_only: bool,
        level: str,
        named: Sequence[str],
        cross_checks: int = CROSS_CHECKS,
    ):
        self.backend = backend
        #: the switchboards whose candidates ``backend`` runs as themselves
        self.runs: Optional[RunsOn] = _runs_on(backend, cpu_only)
        self.on = bool(enabled and self.runs is not None and level == "disable")
        self.named = set(named)
        self._left = cross_checks
        self._since = 0  # switched candidates since the last one built as itself
        self._lock = threading.Lock()
        self._said = False
        #: checks that ran switched (``summary.json``'s ``switched_checks``)
        self.checks = 0
        #: a cross-check that disagreed after switched verdicts were taken: the candidate's label, why, and how many
        #: checks ran switched before it (``summary.json``'s ``switched_disagreed``); None otherwise
        self.disagreed: Optional[Dict[str, Any]] = None

    def __getstate__(self) -> Dict[str, object]:
        """Pickled (a checker sent to a worker process) without its lock."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: Dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def bind(self, model: onnx.ModelProto) -> None:
        """Turn switched runs off when the checker compares a tensor that is no graph output of ``model``."""
        if not self.named <= {o.name for o in model.graph.output}:
            self.on = False

    def counted(self, switched: bool) -> None:
        """Count a check that ran switched (``checks``); checks of several threads may end at once."""
        if switched:
            with self._lock:
                self.checks += 1

    def takes(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` runs switched (its model need not be built, nor its artifact written)."""
        switched = candidate.switched
        return self.on and switched is not None and self.runs in switched.board.offers and not candidate.as_reference

    def board(self, candidate: Candidate) -> Optional[Tuple[Switchboard, Dict[str, np.ndarray]]]:
        """The switchboard and the switch feeds of ``candidate``, or None: it runs as itself (switched
        runs are off, or its search has no switchboard)."""
        if not self.takes(candidate):
            return None
        assert candidate.switched is not None
        board = candidate.switched.board.get(self.runs)
        if board is None:
            self.on = False
            return None
        if not self._said:
            self._said = True
            log.info(
                "Candidates run on one switched model (%d nodes switched, runner.lowp.switchboard); "
                "their iteration artifacts are written only with artifacts.keep_intermediate=true",
                len(board.switches),
            )
        return board, board.feeds(candidate.switched.kept)

    def run(
        self,
        board: Switchboard,
        switches: Dict[str, np.ndarray],
        feeds: Dict[str, np.ndarray],
        outputs: Sequence[str],
    ) -> Dict[str, np.ndarray]:
        """One run of the switched model: the candidate's graph outputs named in ``outputs``.

        Raises:
            ModelError: ONNX Runtime cannot load or run it.
        """
        if isinstance(self.backend, EmulationBackend):  # the model rounds itself: no emulation rewrite
            return self.backend.run_as_rounded(board.model, {**feeds, **switches}, key=board.key, outputs=outputs)
        return self.backend.run(board.model, {**feeds, **switches}, key=board.key, outputs=outputs)

    def facts(self) -> Dict[str, Any]:
        """``summary.json``'s ``switched_checks`` (when any check ran switched), and after a disagreement that
        came once verdicts were taken (``disagreed``): ``switched_disagreed``, ``minimal: false``, ``minimal_why``."""
        found: Dict[str, Any] = {"switched_checks": self.checks} if self.checks else {}
        if self.disagreed is not None:
            found["switched_disagreed"] = self.disagreed
            found["minimal"] = False
            found["minimal_why"] = (
                f"{self.disagreed['switched_checks_before']} verdicts came from the switched model before a "
                f"cross-check found it giving other values than a candidate as built ({self.disagreed['why']}): the "
                "search may have kept more or other nodes than needed; run again with checker.switchboard=false (a "
                "new run directory, no replay.load: the replay holds those verdicts)"
            )
        return found

    def agrees(
        self,
        candidate: Candidate,
        got: Dict[str, np.ndarray],
        feeds: Dict[str, np.ndarray],
        switches: Dict[str, np.ndarray],
    ) -> bool:
        """For the first ``cross_checks`` candidates whose ``switches`` (its switch feeds) are not all one way,
        and one in ``SPOT_EVERY`` after them: whether ``candidate`` built and run as itself gives ``got`` (the
        switched run's outputs on ``feeds``) bit for bit; True for the others. A disagreement turns switched runs
        off, with a warning."""
        values = {bool(v) for v in switches.values()}
        with self._lock:
            if len(values) < 2:
                return True  # every switch one way: the model as given, or its whole conversion
            self._since += 1
            if self._left > 0:
                self._left -= 1
            elif self._since < SPOT_EVERY:
                return True
            self._since = 0
        assert candidate.payload is not None
        try:
            built = self.backend.run(candidate.payload(), feeds, key=candidate.key)
        except ModelError as e:  # the candidate as built cannot run: its own check says so
            built, why = {}, str(e)
        else:
            differ = [n for n in got if n not in built or not np.array_equal(got[n], built[n], equal_nan=True)]
            why = f"outputs {differ} differ" if differ else ""
        if why:
            self.on = False
            earlier = self.checks
            if earlier:  # verdicts the search already took from the switched model
                self.disagreed = {"candidate": candidate.label, "why": why, "switched_checks_before": earlier}
            log.warning(
                "%s: the switched model and the candidate as built disagree (%s); every candidate is built "
                "and run as itself from now on%s",
                candidate.label,
                why,
                f" (the search took {earlier} verdicts from it: the answer will say minimal: false)" if earlier else "",
            )
        return not why


def _runs_on(backend: Backend, cpu_only: bool) -> Optional[RunsOn]:
    """The switchboards whose candidates ``backend`` runs as themselves (``cpu_only``: on ONNX Runtime's CPU
    provider alone), or None."""
    if isinstance(backend, EmulationBackend):
        return RunsOn.EMULATION if cpu_only else None
    if isinstance(backend, OnnxRuntimeBackend):
        return RunsOn.ONNXRUNTIME if cpu_only else RunsOn.DEVICE
    return None
