"""What a precision run has measured of its trade-off, and the early verdict when most of the model must stay.

Every search candidate is a point: how many searchable nodes run in the low precision, the check's statistic
(the worst output's, from an in-process comparison; None for a program's check) and its verdict. The ranked
searches try short prefixes first and double them, so within their first checks they know roughly how much must
stay: once a candidate keeping more than half of the units (the top-ranked ones) still fails, most of the model
may have to stay (a ranking is no proof: another set of that size may pass), and a 1-minimal answer will cost
about a check per kept unit. The run says so then, in the log and in ``summary.json``'s
``most_must_stay``, with what to try, rather than at its end. A ranking can put a needed node late, so that
its long prefixes fail while a small set passes (the 0.5B decoder on an H200: 889 of 1,729 top-ranked failed
at check 17, the answer keeps 183): when a candidate keeping at most half then passes, the run says the verdict
is withdrawn and ``most_must_stay`` gains ``withdrawn`` (``kept``, ``checks``). ``tradeoff`` lists every point and
``tradeoff.png`` draws them. Whatever must stay, the first passing candidate bounds it: the log says at
once how many nodes a candidate that passes keeps, and ``summary.json``'s ``first_pass`` records it
(a budgeted run's answer is never larger).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from runner.candidates import Verdict
from runner.files.figures import save_figure

log = logging.getLogger(__name__)


def worst_output(verdict: Verdict) -> Tuple[Optional[str], Optional[float]]:
    """The output whose statistic is the largest in an in-process comparison's verdict, and that statistic;
    (None, None) for a verdict without per-output statistics (a program's check)."""
    found: Tuple[Optional[str], Optional[float]] = (None, None)
    for name, stats in (verdict.outputs or {}).items():
        value = stats.get("statistic") if isinstance(stats, dict) else None
        if value is None:
            continue
        value = float(value)
        if found[1] is None or value > found[1] or (math.isnan(value) and not math.isnan(found[1])):
            found = (name, value)
    return found


class Tradeoff:
    """The points of one precision run and its early verdict.

    Args:
        total: the searchable units (nodes, or tied positions' nodes: counted as nodes kept).
        low: the low precision's name, for the advice.
    """

    def __init__(self, total: int, low: str):
        self.total, self.low = total, low
        self.points: List[Dict[str, Any]] = []
        self.verdict: Optional[Dict[str, Any]] = None
        #: the first search candidate that passed: ``{"kept", "total", "checks"}``; None before
        self.first_pass: Optional[Dict[str, Any]] = None

    def add(self, kept: int, verdict: Verdict) -> None:
        """One search candidate keeping ``kept`` nodes, and its verdict; the early verdict when it is the first
        failure keeping more than half of them, its withdrawal when a candidate keeping at most half passes
        after it."""
        output, statistic = worst_output(verdict)
        self.points.append(
            {"low_nodes": self.total - kept, "kept": kept, "statistic": statistic, "passed": bool(verdict.passed)}
        )
        if self.verdict is None and not verdict.passed and kept * 2 > self.total:
            self._say(kept, output, statistic)
        elif self.verdict is not None and verdict.passed and kept * 2 <= self.total and "withdrawn" not in self.verdict:
            self.verdict["withdrawn"] = {"kept": kept, "checks": len(self.points)}
            log.info(
                "Most of the model need not stay after all: a candidate keeping %d of %d nodes in float32 passes "
                "(search check %d); the verdict of check %d was the ranking's, whose top-ranked %d fail",
                kept,
                self.total,
                len(self.points),
                self.verdict["checks"],
                self.verdict["kept"],
            )
        if self.first_pass is None and verdict.passed:
            self.first_pass = {"kept": kept, "total": self.total, "checks": len(self.points)}
            log.info(
                "At most %d of %d nodes must stay in float32: a candidate keeping them passes (search check %d)%s",
                kept,
                self.total,
                len(self.points),
                "" if self.verdict is not None else "; the search goes on to the fewest",
            )

    def _say(self, kept: int, output: Optional[str], statistic: Optional[float]) -> None:
        """Log and record that most must stay, with what to try."""
        where = f" ({output}: {statistic:.4g})" if output is not None and statistic is not None else ""
        tries = [
            "a looser tolerance (the measured trade-off: summary.json's tradeoff, tradeoff.png)",
            "budget.checks= or budget.seconds= for the best answer in bounded time",
        ]
        if self.low == "float16":
            tries.insert(0, "low_precision=bfloat16 (fp32's range: errors of overflow go)")
        if output is not None:
            tries.append(f"comparing the tensors before the output whose error dominates, {output} (checker.outputs=)")
        self.verdict = {
            "kept": kept,
            "total": self.total,
            "checks": len(self.points),
            "worst_output": output,
            "statistic": statistic,
            "try": tries,
        }
        log.warning(
            "Most of the model may have to stay: the top-ranked %d of %d nodes kept in float32 still fail%s, after %d "
            "search checks; a 1-minimal answer costs about a check per kept node. Try: %s",
            kept,
            self.total,
            where,
            len(self.points),
            "; ".join(tries),
        )

    def facts(self) -> Dict[str, Any]:
        """``summary.json``'s ``tradeoff`` (every point), ``most_must_stay`` (the early verdict, when said; with
        ``withdrawn`` once a candidate keeping at most half passed) and
        ``first_pass`` (the first passing candidate's size, once one passed)."""
        found: Dict[str, Any] = {"tradeoff": self.points} if self.points else {}
        if self.verdict is not None:
            found["most_must_stay"] = self.verdict
        if self.first_pass is not None:
            found["first_pass"] = self.first_pass
        return found

    def plot(self, path: Path) -> Optional[Path]:
        """``tradeoff.png``: each point's statistic against the nodes in the low precision, passes and failures
        apart; None (nothing written) with fewer than two points with a statistic.

        Raises:
            OSError: the file cannot be written.
        """
        points = [p for p in self.points if p["statistic"] is not None and math.isfinite(p["statistic"])]
        if len(points) < 2:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5))
        for passed, color, label in ((True, "tab:green", "passes"), (False, "tab:red", "fails")):
            chosen = [p for p in points if p["passed"] == passed]
            ax.scatter([p["low_nodes"] for p in chosen], [p["statistic"] for p in chosen], c=color, s=14, label=label)
        if all(p["statistic"] > 0 for p in points):
            ax.set_yscale("log")
        ax.set_xlabel(f"nodes in {self.low} (of {self.total})")
        ax.set_ylabel("the check's statistic (worst output)")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        return save_figure(fig, path)
