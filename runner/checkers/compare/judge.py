"""The compare checker's judgement of one sample: a candidate's outputs against their golden values.

Detections first (``checker.detections``), then the other outputs by the tolerance rule
(``runner.checkers.compare.tolerance``); a shape mismatch of an output whose shape depends on the data is
said as a decision flip (``runner.graph.decisions``). A failing fp32 judgement may then be found to be
within the reference's own fp32 noise (``runner.checkers.compare.noise``): ``Judgement.within_noise``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from runner.candidates import Verdict
from runner.checkers.compare.detections import DetectionRule, judge_logged
from runner.checkers.compare.tolerance import Tolerances, compare_outputs, log_outputs
from runner.graph.decisions import Decision

log = logging.getLogger(__name__)


@dataclass
class Judgement:
    """One sample's outputs judged.

    Attributes:
        passed: whether every output (and the detections) passed.
        stats: ``{output name: statistics}`` as ``runner.checkers.compare.tolerance.compare_outputs`` gives them.
        problems: one line a failing output, the detections' first.
        detections: the detections' judgement, ``(passed, details, problem)``, or None without
            ``checker.detections``.
    """

    passed: bool
    stats: Dict[str, Dict[str, Any]]
    problems: List[str]
    detections: Optional[Tuple[bool, Dict[str, Any], str]] = None

    @property
    def found(self) -> Dict[str, Any]:
        """What a verdict's details carry of the detections (empty without them)."""
        return {"detections": self.detections[1]} if self.detections is not None else {}

    @property
    def arrays_failed(self) -> bool:
        """Whether the failure lies in the arrays, not in the detections (only arrays may be fp32 noise)."""
        return not self.passed and (self.detections is None or self.detections[0])

    def within_noise(self, floors: Mapping[str, float], where: str) -> None:
        """Count the failure as a pass: every failing output is within the reference's own fp32 noise
        (``floors``: ``{output name: noise floor}``, ``runner.checkers.compare.noise.NoiseFloor.floors``); logged
        with ``where`` ("Iteration 4, sample 1")."""
        log.info(
            "%s: %s; within the reference's own fp32 noise (%s): counted as a pass",
            where,
            self.problems[0],
            ", ".join(f"{n} <= {f:.3g}" for n, f in floors.items()),
        )
        for name, floor in floors.items():
            self.stats[name] = {**self.stats[name], "passed": True, "noise_floor": floor}
        self.passed, self.problems = True, []

    def log(self, where: str) -> None:
        """Log the problems and each output's statistics, each line prefixed by ``where``."""
        for line in self.problems:
            log.info("%s: %s", where, line)
        log_outputs(where, self.stats)

    def failed(self, sample: Optional[int], switched: bool) -> Verdict:
        """The failing verdict of this judgement.

        Args:
            sample: the sample's index where a candidate is checked on several, else None.
            switched: whether the candidate ran as feeds of a switched model.
        """
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        reason = (f"sample {sample}: " if sample is not None else "") + self.problems[0] + more
        return Verdict(
            False, reason=reason, details=dict(self.found), outputs=self.stats, switched=switched, sample=sample
        )


class Judge:
    """Judges outputs against golden values: the detections, then the arrays by a tolerance rule.

    Args:
        rule: the tolerance rule at full tolerance (``checker.atol``, ``rtol`` and the statistic).
        detections: ``checker.detections``, or None.

    Attributes:
        decisions: graph outputs whose shape depends on the data, and what decides it (set when the
            checker binds to the model).
    """

    def __init__(self, rule: Tolerances, detections: Optional[DetectionRule]):
        self.rule = rule
        self.detections = detections
        self.decisions: Dict[str, Decision] = {}

    def judge(
        self, got: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], rule: Tolerances, where: str
    ) -> Judgement:
        """``got`` judged against one sample's golden ``values`` by ``rule`` (``self.rule`` or a narrower one,
        for a margin); the detections' lines logged, prefixed by ``where``. No noise floor."""
        judged = judge_logged(got, values, self.detections, where) if self.detections is not None else None
        named = self.detections.tensors() if self.detections is not None else []
        arrays = {n: v for n, v in got.items() if n not in named}
        passed, stats, problems = compare_outputs(arrays, values, rule) if arrays else (True, {}, [])
        problems = [self._decision_hint(p) for p in problems]
        if judged is not None and not judged[0]:
            passed, problems = False, [f"detections: {judged[2]}", *problems]
        return Judgement(passed, stats, problems, judged)

    def at_full_tolerance(
        self, got: Dict[str, np.ndarray], values: Mapping[str, np.ndarray]
    ) -> Tuple[bool, Dict[str, float], str]:
        """``got`` judged at the full tolerance, for ``runner.checkers.compare.arithmetics.verify``:
        (passed, {output: statistic compared}, the first problem or "")."""
        judged = self.judge(got, values, self.rule, "On another arithmetic")
        stats = {n: float(st["statistic"]) for n, st in judged.stats.items()}
        return judged.passed, stats, judged.problems[0] if judged.problems else ""

    def _decision_hint(self, problem: str) -> str:
        """A shape mismatch of an output whose shape depends on the data, said as a decision flip."""
        name, _, what = problem.partition(": ")
        decision = self.decisions.get(name)
        if decision is None or not what.startswith("shape "):
            return problem
        return f"{name}: decision flip, {what}; {decision.hint()}"
