"""``mode=repeat``: run the same check again and again until ``until`` is met.

For flaky failures: each run's artifacts are sorted into good/ or bad/, so the user can diff them.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Dict, Optional

from runner.errors import ModelError
from runner.graph.load import load_model

from strategies.base import Candidate, Strategy, Verdict
from strategies.until import Until


class RepeatStrategy(Strategy):
    """Produces the same (artifact-less) candidate each iteration until ``until`` is met.

    Args:
        until: the stop condition.
        model_path: a model handed to in-process checkers each run, loaded when one first asks
            (``model=`` with ``checker=compare`` checks a backend for nondeterministic outputs).
    """

    artifact_suffix = ""

    def __init__(self, until: Until, model_path: Optional[Path] = None):
        self.until = until
        self.model = functools.cache(lambda: load_model(model_path)) if model_path else None
        self.runs = 0
        self.good = 0
        self.bad = 0
        self.done = False

    @classmethod
    def from_config(cls, cfg: Any) -> "RepeatStrategy":
        """Build from the run config (reads ``until``).

        Raises:
            ConfigError: when ``until`` is missing or invalid.
            ModelError: when ``model=`` is given but is not a file (not ONNX: at the first check
                that loads it).
        """
        until = Until.parse(cfg.until, "repeat")
        if cfg.model and not Path(cfg.model).is_file():
            raise ModelError(f"model={cfg.model}: no such file; check the path (mode=repeat does not need a model)")
        return cls(until, Path(cfg.model) if cfg.model else None)

    def next_candidate(self) -> Optional[Candidate]:
        """Return run number ``runs + 1`` unless ``until`` was met."""
        if self.done:
            return None
        n = self.runs + 1
        return Candidate(key=f"run:{n}", label=f"run {n}", info={"run": n},
                         payload=self.model)

    def take_verdict(self, candidate: Candidate, verdict: Verdict) -> None:
        """Count the verdict and decide whether ``until`` is met."""
        self.runs += 1
        if verdict.passed:
            self.good += 1
        else:
            self.bad += 1
        self.done = self.until.met(self.runs, verdict.passed)

    def remaining(self) -> Optional[int]:
        """Runs left for ``until=N``; unknown for good/bad."""
        return 0 if self.done else self.until.remaining(self.runs)

    def state(self) -> Dict[str, Any]:
        """Counts so far."""
        return {"runs": self.runs, "good": self.good, "bad": self.bad}

    def result(self) -> Dict[str, Any]:
        """Counts of good and bad runs, and whether ``until`` was met."""
        return {"runs": self.runs, "good": self.good, "bad": self.bad, "until_met": self.done}
