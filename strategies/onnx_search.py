"""The shape shared by the ONNX search modes (reduce, precision): gates, a search, the result.

A mode names its candidates by sets of node indices ("units"). Before the search, *gates* check
the candidates whose verdict the search relies on (reduce: the model fails; precision: all kept
passes); a gate whose verdict differs calls its handler, which stops the run, adjusts and checks
again, or ends the search early. Then a ``PrefixSearch`` or ``SetSearch`` proposes unit sets
until it has its result; a mode may add gates after it (reduce's control check). Candidates
build their model only when a check needs it, and are keyed by the model's fingerprint, a
variant (what else shapes the candidate) and the unit set.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import itertools
import logging
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, FrozenSet, Iterable, List, Optional, Protocol, Sequence, Tuple

import onnx

from runner.candidates import Candidate, Verdict
from runner.errors import CheckError
from runner.graph.load import save_model
from runner.graph.validate import Validator
from strategies.ahead import AheadModels
from strategies.answer_check import WrittenAnswer, save_checked
from strategies.base import RoundStrategy
from strategies.budget import Budget
from strategies.gate import Gate

log = logging.getLogger(__name__)

Units = FrozenSet[int]


class Search(Protocol):
    """What an ONNX search strategy asks of its search over unit sets (``strategies.prefix_search``,
    ``strategies.set_search``, precision's ``group_search``, ``tied_search``, ``exchange``, and a
    ``deferred_search`` standing for one): rounds (``RoundSearch``'s ``propose``, ``step_round``, ``settled``,
    ``ahead``), its ``result`` once over (None: none), the units found ``required`` so far, the ``rounds`` run,
    the label of a round's i-th set and an estimate of the checks left."""

    @property
    def result(self) -> Optional[FrozenSet[int]]: ...

    @property
    def rounds(self) -> int: ...

    @property
    def required(self) -> Iterable[int]: ...

    def propose(self, k: int) -> List[FrozenSet[int]]: ...

    def step_round(self, hits: Sequence[Optional[bool]]) -> None: ...

    def settled(self, hits: Sequence[Optional[bool]]) -> bool: ...

    def ahead(self, sets: Sequence[FrozenSet[int]], k: int) -> List[List[FrozenSet[int]]]: ...

    def label(self, noun: str, i: int) -> str: ...

    def remaining(self) -> int: ...


class OnnxSearchStrategy(RoundStrategy):
    """Base of reduce and precision: gates, then ``search``, then ``finish`` writes the result.

    Args:
        search: the search over unit sets.
        universe: every unit (the result when the search ends with none).
        hit_on_pass: True when the search's target is a passing candidate (precision), False when
            it is a failing one (reduce).
        output: where the final model is written.
        save_opts: ``external_data`` and ``threshold`` for ``save_model``.
        model_fingerprint: ``runner.graph.load.fingerprint`` of the model the units index.
    """

    noun = "node"

    #: candidates run exactly as typed (``Candidate.as_typed``): checkers must not convert them
    as_typed = False

    def __init__(
        self,
        search: Search,
        universe: Iterable[int],
        hit_on_pass: bool,
        output: Path,
        save_opts: Optional[Dict[str, Any]],
        model_fingerprint: str,
    ):
        self.search = search
        self.universe: Units = frozenset(universe)
        self.hit_on_pass: bool = hit_on_pass
        self.output = Path(output)
        self.save_opts = save_opts or {}
        #: ``save_model``'s options for the answer (``runner.config.answer_options``: also ``external_data_path``)
        self.answer_opts: Dict[str, Any] = dict(self.save_opts)
        self.fingerprint = model_fingerprint
        self.gates: Deque[Gate] = deque()
        self.final: Optional[Units] = None
        self._round_gates: List[Gate] = []  # the gates of the last round (first in it)
        self._gate_units: List[Optional[Units]] = []
        self._round: List[Units] = []  # the unit sets of the last round (a gate's alone)
        self._made: Optional[Units] = None  # the unit set of the candidate made last
        #: per-output statistics of each in-process check (checker=compare), by unit set
        self._outputs: Dict[Units, Any] = {}
        #: models built ahead for the round to come (``lookahead``), by variant and unit set
        self.ahead = AheadModels()
        #: validates every candidate model before it is checked (set by the mode from its source model)
        self.validator: Optional[Validator] = None
        self._answer: Optional[WrittenAnswer] = None  # the written answer, once written
        self._reused_misses: List[Units] = []  # unit sets whose miss came from a replay
        self._passed = False  # some check passed (an answer resting on none is never written)
        #: ``budget.*``: where the search stops short with the best answer checked so far (``strategies.budget``)
        self.budget: Optional[Budget] = None

    # -- what a mode defines ----------------------------------------------------------------

    @abc.abstractmethod
    def model_for(self, units: Units) -> onnx.ModelProto:
        """The candidate model of a unit set (built only when a check needs it)."""

    @abc.abstractmethod
    def size(self, units: Units) -> str:
        """A short text of a candidate's size for its label, e.g. "12 nodes"."""

    def variant(self) -> str:
        """What besides the units shapes a candidate (part of its key); default none."""
        return ""

    def step(self, units: Units) -> str:
        """What builds a unit set's model, for the message when it is invalid."""
        return f"building the candidate of {self.size(units)}"

    def valid_model(self, units: Units) -> onnx.ModelProto:
        """``model_for(units)``, validated (``runner.graph.validate``) when the mode set a validator.

        Raises:
            InvalidCandidateError: the model is invalid (the tool's defect; the run stops unchecked).
        """
        model = self.model_for(units)
        return model if self.validator is None else self.validator.check(model, self.step(units))

    def info(self, units: Units) -> Dict[str, Any]:
        """The candidate's facts for the iteration info file (JSON-able)."""
        return {"units": len(units)}

    def after_search(self) -> Optional[Gate]:
        """A gate to check once the search has its result (default none)."""
        return None

    def answer_of(self, result: Units) -> Units:
        """The unit set the search's ``result`` (or ``universe``, when it ends with none) stands for (default:
        itself; a stage whose sets carry the stage before's answer closes it, as its candidates are)."""
        return result

    def next_stage(self) -> bool:
        """Called once the search has its result and no gate is left, before the answer is written: a
        mode whose answer takes a second search sets ``search`` and the gates of that stage, clears
        ``final`` (``begin_stage``) and returns True; default False (the answer is ``final``)."""
        return False

    def begin_stage(self, search: Search) -> None:
        """Start a further search stage: ``search`` proposes from now on and ``final`` is unset. The
        replayed misses of the stage before were checked again when it ended, and are not carried over."""
        self.search = search
        self.final = None
        self._reused_misses.clear()

    def on_search_verdict(self, units: Units, verdict: Verdict) -> None:
        """Called with every search candidate's verdict before the search takes it (default nothing)."""

    def describe(self, units: Iterable[int]) -> List[Dict[str, str]]:
        """Name and op type of each unit, for the state and the summary."""
        return []

    # -- candidates -------------------------------------------------------------------------

    def key(self, units: Units) -> str:
        """The replay key of a unit set: fingerprint, variant and a digest of the sorted indices."""
        digest = hashlib.sha1(",".join(map(str, sorted(units))).encode()).hexdigest()[:16]
        return f"{self.fingerprint}:{self.variant()}:{digest}"

    def build_ahead(self, units: Units) -> bool:
        """Build the model of ``units`` for a later round (``lookahead``) and hold it until the next
        ``next_round``; False when it does not fit in the budget with the ones held (``AheadModels.build``).

        Raises:
            InvalidCandidateError: the model is invalid (``valid_model``).
        """
        # reduce's variant changes when it keeps Constant nodes
        return self.ahead.build((self.variant(), units), lambda: self.valid_model(units))

    def candidate(self, units: Units, label: str) -> Candidate:
        """The candidate of a unit set (its ``closure``): its model was built ahead, or is built on
        first use and kept for the iteration."""
        units = self.closure(units)
        self._made = units
        ready = self.ahead.take((self.variant(), units))
        model = (lambda: ready) if ready is not None else functools.cache(lambda: self.valid_model(units))
        return Candidate(
            self.key(units),
            f"{label}: {self.size(units)}",
            functools.partial(self.write_candidate, units, model),
            self.info(units),
            payload=self.payload(model),
            as_typed=self.as_typed,
            units=units,
        )

    def write_candidate(self, units: Units, model: Callable[[], onnx.ModelProto], path: Path) -> None:
        """Write a candidate's artifact (default: its model, with the save options)."""
        save_model(model(), path, **self.save_opts)

    def payload(self, model: Callable[[], onnx.ModelProto]) -> Optional[Callable[[], onnx.ModelProto]]:
        """What in-process checkers run (default: the candidate's model)."""
        return model

    def next_round(self, k: int) -> List[Candidate]:
        """The queued gates (up to ``k``), with the search's next sets in the slots left while the
        search is on (``propose``: they assume every gate gives its expected verdict); else up to
        ``k`` of the search's sets; else the gates after the search. Its candidates take the
        models built ahead for them; the others (other outcomes') are dropped."""
        round_ = self._next_round(k)
        self.ahead.clear()
        if round_:
            log.debug("Next round (up to %d): %s", k, "; ".join(c.label for c in round_))
        return round_

    def _next_round(self, k: int) -> List[Candidate]:
        self._round, self._round_gates, self._gate_units = [], [], []
        while True:
            made: List[Candidate] = []
            for gate in list(self.gates)[:k]:
                self._made = None
                made.append(gate.make())
                self._round_gates.append(gate)
                self._gate_units.append(self._made)  # None: a gate whose candidate is no unit set (reduce's original)
            if self.final is not None:
                if not made and not self._stopped_short() and self.next_stage():
                    continue
                if not made and self.verify_answer and self._answer is None and (self._passed or not self.needs_pass):
                    answer = self._write_answer(self.final)
                    self.gates.append(Gate(self._answer_candidate, self.hit_on_pass, self._answer_failed, answer.held))
                    continue
                return made
            if not made and self._budget_spent():
                continue
            sets = self.search.propose(k - len(made)) if len(made) < k else []
            if sets or made:
                self._round = sets
                return made + [self.candidate(units, self.search.label(self.noun, i)) for i, units in enumerate(sets)]
            result = self.search.result
            self.final = self.answer_of(result if result is not None else self.universe)
            self.gates.extend(self._rechecks(self.final))
            after = self.after_search()
            if after is not None:
                self.gates.append(after)

    def _stopped_short(self) -> bool:
        """Whether the budget stopped the search (no further stage then)."""
        return self.budget is not None and bool(self.budget.stopped)

    def _budget_spent(self) -> bool:
        """Stop the search at its budget (``strategies.budget``): the answer is the best hit checked so far,
        written and verified as any answer. False while the budget lasts, or no hit is known yet."""
        if self.budget is None or self.final is not None or self.budget.best is None:
            return False
        why = self.budget.over()
        if not why:
            return False
        self.budget.stopped = why
        self.final = self.answer_of(self.budget.best)
        log.warning(
            "%s: the search stops short of its minimal answer; the answer is the smallest %s checked so far (%s); "
            "resume with replay.load= and a larger budget for the minimal one",
            why,
            "passing set" if self.hit_on_pass else "failing subgraph",
            self.size(self.final),
        )
        return True

    def _rechecks(self, final: Units) -> List[Gate]:
        """A gate for each replayed miss the answer rests on: a unit set inside the answer whose verdict
        came from a replay (it shows that some answer unit is needed) is checked again, and a verdict that
        changed stops the run (an edited replay, or a check that is not deterministic)."""
        gates: List[Gate] = []
        for units in dict.fromkeys(self._reused_misses):
            if not (units < final):
                continue

            def make(units: Units = units) -> Candidate:
                made = self.candidate(units, "a replayed verdict the answer rests on, checked again")
                return dataclasses.replace(made, reuse=False)

            def changed(verdict: Verdict, units: Units = units) -> None:
                raise CheckError(
                    f"the candidate of {self.size(units)}, whose replayed verdict the answer rests on, gives the other "
                    "verdict when checked again: the replay was edited or the check is not deterministic; drop "
                    "replay.load and run again"
                )

            gates.append(Gate(make, not self.hit_on_pass, changed))
        return gates

    def lookahead(self, k: int) -> List[Tuple[str, Callable[[], bool]]]:
        """The search's sets of the rounds that may follow this one (``RoundSearch.ahead``, the gates
        of the round assumed to give their expected verdicts), first set of each outcome first; each
        build is ``build_ahead``. Nothing while the search is over or for a round without search sets."""
        if self.final is not None or not self._round:
            return []
        seen = {self.closure(units) for units in self._round}
        work: List[Tuple[str, Callable[[], bool]]] = []
        rounds = self.search.ahead(self._round, k)
        for found in itertools.chain.from_iterable(itertools.zip_longest(*rounds)):  # each round's first set first
            if found is None:  # past the end of a shorter round
                continue
            units = self.closure(found)
            if units not in seen:
                seen.add(units)
                work.append((self.key(units), functools.partial(self.build_ahead, units)))
        return work

    def closure(self, units: Units) -> Units:
        """The unit set a search set is checked as (default: itself; reduce closes it as its options ask)."""
        return units

    def take_round(self, candidates: Sequence[Candidate], verdicts: Sequence[Optional[Verdict]]) -> None:
        """Gates' verdicts first, in order: an unexpected one goes to its handler, and the rest of
        the round (which assumed it) is dropped, to be proposed again; then the search's verdicts."""
        self._passed = self._passed or any(v is not None and v.passed for v in verdicts)
        gates = len(self._round_gates)
        for gate, units, verdict in zip(self._round_gates, self._gate_units, verdicts):
            assert verdict is not None, "a round with gates is never settled early"
            self.gates.popleft()
            if self.budget is not None:
                self.budget.took(units, verdict.passed == self.hit_on_pass, verdict.reused, verdict.check_s)
            if units is not None:
                self._keep_outputs(units, verdict)
            if verdict.passed != gate.expect_pass:
                gate.otherwise(verdict)
                return
            if gate.then is not None:
                gate.then(verdict)
        searched = verdicts[gates:]
        if not self._round:
            return
        for units, verdict in zip(self._round, searched):
            if verdict is not None:
                if self.budget is not None:
                    self.budget.took(
                        self.closure(units), verdict.passed == self.hit_on_pass, verdict.reused, verdict.check_s
                    )
                self._keep_outputs(units, verdict)
                self.on_search_verdict(units, verdict)
                if verdict.reused and not verdict.sealed and verdict.passed != self.hit_on_pass:
                    self._reused_misses.append(self.closure(units))
        self.search.step_round([None if v is None else v.passed == self.hit_on_pass for v in searched])

    def settled(self, verdicts: Sequence[Optional[Verdict]]) -> bool:
        """The search's ``settled``; never while a gate is in the round."""
        if self._round_gates:
            return False
        return self.search.settled([None if v is None else v.passed == self.hit_on_pass for v in verdicts])

    def _keep_outputs(self, units: Units, verdict: Verdict) -> None:
        """Keep a compare check's per-output statistics by unit set (for ``answer_outputs``)."""
        if verdict.outputs is not None:
            self._outputs[units] = verdict.outputs

    def remaining(self) -> Optional[int]:
        """Gates left plus the search's estimate for its current round."""
        return len(self.gates) + (self.search.remaining() if self.final is None else 0)

    def state(self) -> Dict[str, Any]:
        """Rounds done and the units found necessary so far."""
        return {"rounds": self.search.rounds, "necessary": self.describe(self.search.required)}

    def answer_outputs(self) -> Dict[str, Any]:
        """``{"answer_outputs": per-output statistics}`` of the check of the final unit set, when an
        in-process checker (compare) checked it; else empty. For ``summary.json``."""
        found = self._outputs.get(self.final) if self.final is not None else None
        return {"answer_outputs": found} if found is not None else {}

    def output_model(self, units: Units) -> onnx.ModelProto:
        """The model written as a result (default: the candidate model itself)."""
        return self.valid_model(units)

    # -- the answer, written and verified ----------------------------------------------------

    #: whether the written answer is checked again (False where the answer is no checkable model)
    verify_answer = True
    #: whether the written answer is loaded in ONNX Runtime on CPU (``loads_on_cpu``): only a model the
    #: tool converted; a reduced model may be the very one that crashes a backend, so it is never loaded here
    answer_cpu_load = False
    #: whether it must load (a failure other than a missing kernel stops the run)
    answer_must_load_on_cpu = False

    def _write_answer(self, units: Units) -> WrittenAnswer:
        """Write the answer of ``units`` to ``output`` (``WrittenAnswer.write``) and keep it for its check.

        Raises:
            ModelError: the file does not pass onnx.checker. AnswerNotVerifiedError: it must load in
                ONNX Runtime on CPU and does not.
        """
        self._answer = WrittenAnswer(
            self.output, self.answer_opts, self.hit_on_pass, self.answer_cpu_load, self.answer_must_load_on_cpu
        )
        self._answer.write(lambda: self.output_model(units), self.size(units))
        self._answer.facts["size"] = self.size(units)  # said with the verdict, also when it is not stood behind
        return self._answer

    def _answer_failed(self, verdict: Verdict) -> None:
        """The written answer gave the other verdict: its candidate is checked once more (never from the
        replay) before the run stops, so that the error says which it is: a check that is not
        deterministic, or a file that differs from the candidate the search checked."""
        assert self._answer is not None and self.final is not None
        answer, final = self._answer, self.final

        def make() -> Candidate:
            return dataclasses.replace(self.candidate(final, "the answer's candidate, checked again"), reuse=False)

        self.gates.append(
            Gate(
                make,
                self.hit_on_pass,
                lambda again: answer.failed(verdict, again),
                lambda again: answer.failed(verdict, again),
            )
        )

    def _answer_candidate(self) -> Candidate:
        """The written ``output`` as a candidate (``WrittenAnswer.candidate``)."""
        assert self.final is not None and self._answer is not None
        self._made = None  # its statistics go to answer_verified, not to the unit set's
        units = self.final
        return self._answer.candidate(self.key(units), self.size(units), self.info(units), self.as_typed)

    def answer_verified(self) -> Dict[str, Any]:
        """``{"answer_verified": ...}`` for ``summary.json`` once the written answer was checked."""
        found = self._answer.summary() if self._answer is not None else None
        return {"answer_verified": found} if found is not None else {}

    def finish(self) -> None:
        """Write the final model when the answer check did not already (``verify_answer`` off)."""
        assert self.final is not None
        if self._answer is None:
            final = self.final
            save_checked(lambda: self.output_model(final), self.output, self.answer_opts, self.size(final))
