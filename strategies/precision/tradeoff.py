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


def worst_limit(verdict: Verdict, output: Optional[str]) -> Tuple[Optional[float], str]:
    """The tolerance of the statistic of ``output`` (the worst, ``worst_output``'s) (``OutputStats.limit``) and what
    the statistic measures; (None, "") for a program's check or verdicts of an earlier version."""
    stats = (verdict.outputs or {}).get(output) if output is not None else None
    if not isinstance(stats, dict):
        return None, ""
    limit = stats.get("limit")
    return (float(limit) if limit is not None else None), str(stats.get("measure") or "")


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
        #: the tolerance of the statistic and what it measures, from the verdicts (``worst_limit``)
        self.limit: Optional[float] = None
        self.measure = ""

    def add(self, kept: int, verdict: Verdict) -> None:
        """One search candidate keeping ``kept`` nodes, and its verdict; the early verdict when it is the first
        failure keeping more than half of them, its withdrawal when a candidate keeping at most half passes
        after it."""
        output, statistic = worst_output(verdict)
        limit, measure = worst_limit(verdict, output)
        if limit is not None:
            self.limit, self.measure = limit, measure
        nonfinite = any(isinstance(s, dict) and s.get("new_nonfinite") for s in (verdict.outputs or {}).values())
        self.points.append(
            {"low_nodes": self.total - kept, "kept": kept, "statistic": statistic, "passed": bool(verdict.passed)}
        )
        if nonfinite:  # a NaN/Inf decided: its statistic (over finite values) says nothing
            self.points[-1]["nonfinite"] = True
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

    def plot(self, path: Path, answer: Optional[int] = None, model: str = "") -> Optional[Path]:
        """``tradeoff.png``, as a person reads it: every search candidate's statistic (the worst output's) against
        the nodes it keeps in float32, passes and failures apart, the tolerance as a line, the first passing
        candidate and the answer marked, a title naming the model, the precision and the statistic. A program's
        check (no statistic) gets its verdicts over the nodes kept instead. None (nothing written) with fewer than
        two points.

        Args:
            path: the file to write.
            answer: the nodes the answer keeps in float32, or None when the run has none.
            model: the model's file name, for the title.

        Raises:
            OSError: the file cannot be written.
        """
        fig = self.figure(answer, model)
        return None if fig is None else save_figure(fig, path)

    def figure(self, answer: Optional[int] = None, model: str = "") -> Any:
        """The ``matplotlib.figure.Figure`` ``plot`` writes (arguments as ``plot``'s), or None with fewer than two
        points."""
        if len(self.points) < 2:
            return None  # one point is no trade-off
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        measured = [
            p
            for p in self.points
            if p["statistic"] is not None and math.isfinite(p["statistic"]) and not p.get("nonfinite")
        ]
        broken = [
            p["kept"]
            for p in self.points
            if p.get("nonfinite") or (p["statistic"] is not None and not math.isfinite(p["statistic"]))
        ]
        fig, ax = plt.subplots(figsize=(9, 5))
        if len(measured) + len(broken) >= 2 and measured:
            self._draw_statistic(ax, measured)
            if broken:  # above the plot's top: no statistic to place them by
                top = ax.get_xaxis_transform()
                label = f"fails with NaN/Inf ({len(broken)})"
                ax.scatter(broken, [0.97] * len(broken), marker="^", c="tab:red", s=30, transform=top, label=label)
            what = f"{self.measure or 'the statistic'} of the worst output"
        else:  # a program's check: its verdicts
            for passed, color, label in ((True, "tab:green", "passes"), (False, "tab:red", "fails")):
                chosen = [p["kept"] for p in self.points if p["passed"] == passed]
                ax.scatter(chosen, [int(passed)] * len(chosen), c=color, s=22, label=f"{label} ({len(chosen)})")
            ax.set_yticks([0, 1], ["fails", "passes"])
            ax.set_ylim(-0.5, 1.5)
            ax.set_ylabel("the check's verdict")
            what = "verdicts of the check program"
        self._mark(ax, answer, measured if measured else None)
        widest = max([p["kept"] for p in self.points] + ([answer] if answer is not None else []))
        ax.set_xlim(-0.03 * widest - 0.5, 1.05 * widest + 0.5)
        ax.set_xlabel(f"nodes kept in float32 (of {self.total} searched; the rest in {self.low})")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        title = f"{model}: " if model else ""
        ax.set_title(f"{title}{self.low} precision search, {len(self.points)} candidates: {what}", fontsize=10)
        fig.tight_layout()
        return fig

    def _draw_statistic(self, ax: Any, measured: List[Dict[str, Any]]) -> None:
        """The measured points and the tolerance's line."""
        for passed, color, label in ((True, "tab:green", "passes"), (False, "tab:red", "fails")):
            chosen = [p for p in measured if p["passed"] == passed]
            if not chosen:
                continue
            ax.scatter(
                [p["kept"] for p in chosen],
                [p["statistic"] for p in chosen],
                c=color,
                s=22,
                label=f"{label} ({len(chosen)})",
            )
        values = [p["statistic"] for p in measured] + ([self.limit] if self.limit else [])
        if all(v > 0 for v in values):
            ax.set_yscale("log")
            ax.set_ylim(min(values) / 3, max(values) * 3)
        if self.limit is not None:
            ax.axhline(self.limit, color="tab:blue", linestyle="--", linewidth=1, label=f"tolerance ({self.limit:g})")
        ax.set_ylabel(f"{self.measure or 'statistic'} (worst output)")

    def _mark(self, ax: Any, answer: Optional[int], measured: Optional[List[Dict[str, Any]]]) -> None:
        """Ring the first passing candidate and star the answer (at its point, where the search checked it)."""

        def height(kept: int) -> Optional[float]:
            if measured is None:
                return 1.0
            found = [p["statistic"] for p in measured if p["kept"] == kept and p["passed"]]
            return found[-1] if found else None

        if self.first_pass is not None:
            y = height(self.first_pass["kept"])
            if y is not None:
                first = f"first to pass ({self.first_pass['kept']} kept, check {self.first_pass['checks']})"
                ax.scatter([self.first_pass["kept"]], [y], s=140, facecolors="none", edgecolors="black", label=first)
        if answer is not None:
            y = height(answer)
            if y is not None:
                star = f"the answer ({answer} kept)"
                ax.scatter([answer], [y], marker="*", s=260, c="gold", edgecolors="black", zorder=5, label=star)
            else:
                ax.axvline(answer, color="goldenrod", linewidth=1.5, label=f"the answer ({answer} kept)")
