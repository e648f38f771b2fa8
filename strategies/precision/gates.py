"""The checks of a precision search besides its search's candidates, and what their verdicts mean.

- The all-fp32 gate (every node kept; the model as given): its failure means no kept set can pass.
- The all-low-precision candidate (no node kept): checked once a search candidate passes before any
  fails, or when the search tested nothing, since the markers assume it fails; int8 checks it first
  (post-training int8 often passes as it is). Its pass ends the run with no node kept.
- The all-kept candidate as the pipeline builds it: checked right after the model as given where the model's
  outputs are decisions (a near-tied NMS flips between two builds of one fp32 graph: the run ends in 2 checks),
  else once a large candidate fails, or when no search candidate passed; its failure means what the candidates
  change outside the searched nodes already flips the check.
"""

from __future__ import annotations

import logging
from typing import List, Optional

from runner.candidates import Verdict
from runner.errors import CheckNeverPassedError
from runner.lowp.precisions import LowPrecision
from strategies.gate import Gate
from strategies.onnx_search import OnnxSearchStrategy, Units
from strategies.precision.stages import Stage
from strategies.precision.tradeoff import Tradeoff

log = logging.getLogger(__name__)

#: the share of the searched nodes a failing candidate keeps (and at least 32) from which the all-kept
#: candidate as the pipeline builds it is checked once: a run whose every candidate fails for what the
#: pipeline changes stops there, in about 10 checks, instead of searching the whole model
PIPELINE_CHECK_FROM = 1 / 8


class PrecisionGates(OnnxSearchStrategy):
    """The gates of ``strategies.precision.PrecisionStrategy`` (module docstring), on the state it sets up:

    Attributes:
        _some_failed: a search candidate (or int8's fully quantized one) failed.
        _none_queued: the all-low-precision candidate is queued or checked.
        _pipeline_checked: the all-kept candidate as the pipeline builds it is queued or checked, or not
            needed (the all-fp32 gate checked it: no model as given, weak typing, a scope).
        _search_passed: a search candidate passed.
    """

    layers: List[int]
    low: LowPrecision
    scoped: bool
    stage: Stage
    _some_failed: bool
    _none_queued: bool
    _pipeline_checked: bool
    _search_passed: bool
    tradeoff: Optional[Tradeoff]

    @property
    def _fp16_stage(self) -> bool:
        """Whether the first of two stages runs (fp16 before int8: ``strategies.precision.float_rest``)."""
        return self.stage.first_of_two

    def _all_fp16_passed(self, verdict: Verdict) -> None:
        log.info("The check passes with every float node in float16: no node needs float32")
        self.final = frozenset()

    def _all_kept_failed(self, verdict: Verdict) -> None:
        where = "every node in scope" if self.scoped else "every node"
        advice = "widen include_nodes/include_op_types, or check " if self.scoped else "check "
        raise CheckNeverPassedError(
            f"the check fails even with {where} in float32, so no kept set can pass; "
            f"{advice}the checker, its tolerances and the golden outputs",
            tail=verdict.output_tail,
        )

    def on_search_verdict(self, units: Units, verdict: Verdict) -> None:
        """A failing search candidate shows that no smaller kept set passes, the empty one included
        (monotone); a pass before any failure queues the all-low-precision check, which then runs
        before the search goes on (the markers assume it fails). The first failing candidate that keeps
        ``PIPELINE_CHECK_FROM`` of the nodes or more queues the all-kept candidate as the pipeline
        builds it (``_pipeline_gate``)."""
        self._search_passed = self._search_passed or verdict.passed
        if self.tradeoff is not None and not self._fp16_stage:
            self.tradeoff.add(len(units), verdict)
        if self._fp16_stage:
            return
        if not verdict.passed:
            self._some_failed = True
            if not self._pipeline_checked and len(units) >= max(32, len(self.layers) * PIPELINE_CHECK_FROM):
                self._pipeline_checked = True
                self.gates.append(self._pipeline_gate())
        elif not self._some_failed and not self._none_queued:
            self._none_queued = True
            self.gates.append(self._none_gate())

    def after_search(self) -> Optional[Gate]:
        """The all-low-precision check, when the search ended without testing anything; the all-kept
        candidate as the pipeline builds it, when no search candidate passed (the answer rests on the
        all-fp32 gate's model as given alone). None in the fp16 stage of an int8 search with the rest in fp16."""
        if self._fp16_stage:
            return None
        if not self._pipeline_checked and not self._search_passed and self._some_failed:
            self._pipeline_checked = True
            return self._pipeline_gate()
        if self._some_failed or self._none_queued or not self.final:
            return None
        return self._none_gate()

    def _pipeline_gate(self) -> Gate:
        """Every node kept, as the pipeline builds candidates (not the model as given): a check that fails
        it can never pass a candidate, whatever the search keeps, because what changes outside the searched
        nodes already flips it."""
        everything: Units = frozenset(self.layers)
        return Gate(
            lambda: self.candidate(everything, "every node kept, as candidates are built"), True, self._pipeline_failed
        )

    def _pipeline_failed(self, verdict: Verdict) -> None:
        raise CheckNeverPassedError(
            f"every node kept in float32 fails as candidates are built ({verdict.reason or 'no reason given'}), "
            "though your model as given passes: what the candidates change outside the searched nodes (the "
            f"{self.low} conversion's Casts at the graph's inputs and outputs, nodes it cannot convert, how the "
            "backend runs a converted graph) already flips the check, so no kept set can pass; compare the tensors "
            "before a decision (checker.outputs=[...]), judge detections with room for a flipped box "
            "(checker.detections with max_unmatched=), or loosen the tolerance",
            tail=verdict.output_tail,
        )

    def _int8_gate(self) -> Gate:
        """The fully quantized candidate, checked before an int8 search: a failure is what the search assumes."""
        return Gate(
            lambda: self.candidate(frozenset(), "no node kept"),
            False,
            self._none_kept_passed,
            lambda verdict: setattr(self, "_some_failed", True),
        )

    def _none_gate(self) -> Gate:
        return Gate(lambda: self.candidate(frozenset(), "no node kept"), False, self._none_kept_passed)

    def _none_kept_passed(self, verdict: Verdict) -> None:
        log.info("The check passes with every node in %s: no node needs float32", self.low)
        self.final = self.closure(frozenset())
