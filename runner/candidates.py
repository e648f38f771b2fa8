"""The vocabulary every layer shares: a candidate to check and the verdict a check gives it.

They sit at the bottom of the import graph (checkers, executors, the replay, the lifecycle and the
strategies all use them; they import nothing of the project: precision's switched-run record,
``runner.lowp.switchboard.Switched``, is carried without being named).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Optional

if TYPE_CHECKING:
    import onnx


@dataclass
class Verdict:
    """The outcome of checking one candidate.

    Attributes:
        passed: True when the candidate passed the check (is "good").
        returncode: the check command's exit code, when there was a command (None otherwise).
        reason: one short line: why it failed, e.g. "exit code 1", "timeout after 5.0 s".
        details: a checker's own other facts for the log, the iteration info and the replay (JSON-able; the
            compare checker's detections found).
        error: why the check could not judge the candidate (e.g. a backend cannot run it); "" for
            a real verdict. Such verdicts are counted apart from failures.
        reused: the verdict was taken from a replay, not checked in this run.
        sealed: a reused verdict needs no second check before an answer rests on it: this run checked
            it, or its replay is as a run wrote it (its seal holds: nobody edited it, and its identity is
            this run's).
        crash: the check crashed its process (or, replayed, the runner): a failure of its own kind.
        check_s: seconds ``checker.check`` took where it ran (None: not run here, or replayed
            without it).
        outputs: the compare checker's error statistics, ``{output name: {statistic: value}}``;
            None for other checkers.
        output_tail: the end of a check command's output ("" for in-process checks).
        switched: the candidate ran as feeds of a switchboard (one session holding every candidate)
            instead of being built (``summary.json``'s ``switched_checks`` counts these).
        verified: for a precision answer as written, the margin it was searched with and its run on
            each arithmetic at the full tolerance, ``{"margin": float, "on": {"cpu:all": {"provider",
            "level", "passed", "reason", "statistic": {output: value}}}}`` (``runner.checkers.compare.arithmetics``);
            None for other candidates and checkers.
        timeout: the check ran past its time limit and was stopped (a failure).
        output_file: where a check command's whole output was kept, or None.
        sample: the input sample a failing comparison failed on, with several samples; else None.
        crashed_iteration: for a replayed crash, the iteration it crashed in; else None.
        verdict_s: seconds from the check's submission to its verdict (the lifecycle's), or None.
    """

    passed: bool
    returncode: Optional[int] = None
    reason: str = ""
    details: Dict[str, Any] = field(default_factory=dict)
    error: str = ""
    reused: bool = False
    sealed: bool = False
    crash: bool = False
    check_s: Optional[float] = None
    outputs: Optional[Dict[str, Dict[str, Any]]] = None
    output_tail: str = ""
    switched: bool = False
    verified: Optional[Dict[str, Any]] = None
    timeout: bool = False
    output_file: Optional[str] = None
    sample: Optional[int] = None
    crashed_iteration: Optional[int] = None
    verdict_s: Optional[float] = None

    #: the typed facts, kept under these names in the replay's ``details`` (the file's format is unchanged)
    TYPED = (
        "crash",
        "check_s",
        "outputs",
        "output_tail",
        "switched",
        "verified",
        "timeout",
        "output_file",
        "sample",
        "crashed_iteration",
        "verdict_s",
    )

    def recorded_details(self) -> Dict[str, Any]:
        """``details`` with the typed facts that are set, as ``replay.json`` holds them."""
        typed = {name: getattr(self, name) for name in self.TYPED}
        return {**self.details, **{k: v for k, v in typed.items() if v is not None and v is not False and v != ""}}

    @classmethod
    def from_record(
        cls, details: Dict[str, Any], passed: bool, returncode: Optional[int] = None, reason: str = "", error: str = ""
    ) -> Verdict:
        """A verdict from a replay entry: its ``details`` (the typed facts taken out of them) and its fields."""
        rest = {k: v for k, v in details.items() if k not in cls.TYPED}
        return cls(
            passed,
            returncode,
            reason,
            rest,
            error,
            crash=bool(details.get("crash", False)),
            check_s=details.get("check_s"),
            outputs=details.get("outputs"),
            output_tail=str(details.get("output_tail", "")),
            switched=bool(details.get("switched", False)),
            verified=details.get("verified"),
            timeout=bool(details.get("timeout", False)),
            output_file=details.get("output_file"),
            sample=details.get("sample"),
            crashed_iteration=details.get("crashed_iteration"),
            verdict_s=details.get("verdict_s"),
        )


@dataclass
class Candidate:
    """One iteration's candidate.

    Attributes:
        key: identity for the replay cache; two candidates with the same key get the same verdict.
        label: a short human description for the log and the progress bar.
        write: writes the iteration artifact to the given path (None: the check makes its own).
        info: the mode's state for the iteration info file and the replay (JSON-able).
        payload: returns the candidate's model for in-process checkers (built on first call), or
            None when the candidate is not an ONNX model in memory (the checker reads the artifact).
        as_typed: run exactly as typed: the mode decided each node's precision (precision's
            candidates), so a checker must not convert it to a low precision.
        write_in_check: the check writes the artifact itself (a TensorRT build in a worker).
        reuse: whether a verdict the replay holds for ``key`` may stand for a check; False for
            the check of a written answer, which is always run.
        twin: the key of the candidate this one copies (the written answer: the search's
            candidate); a crash recorded for the twin stands for this one too (it would crash
            the runner again), reuse or not.
        units: the unit set a search candidate is (node indices), recorded in the replay so that
            verdicts can be checked against each other (``runner.files.monotone``); None for others.
        as_reference: the candidate is the model whose golden values the checker made: a checker
            that made them runs it exactly as it made them (same backend, same session options),
            so that it gives them back (precision's all-fp32 candidate).
        switched: the candidate as one feed set of its search's switched model (precision's fp16,
            bf16 and TensorRT-placed int8 candidates, ``runner.lowp.switchboard``), which a checker
            whose backend runs it as written may run instead of building its model; None for others,
            and for checks in another process.
    """

    key: str
    label: str
    write: Optional[Callable[[Path], None]] = None
    info: Dict[str, Any] = field(default_factory=dict)
    payload: Optional[Callable[[], onnx.ModelProto]] = None
    as_typed: bool = False
    write_in_check: bool = False
    reuse: bool = True
    twin: Optional[str] = None
    units: Optional[FrozenSet[int]] = None
    as_reference: bool = False
    switched: Any = None  # a runner.lowp.switchboard.Switched, or None

    def portable(self, payload: Optional[Callable[[], Any]]) -> Candidate:
        """The candidate as a check in another process receives it: ``payload`` (its model, built here), no
        writer and no switchboard (a task elsewhere cannot call back into the strategy)."""
        return dataclasses.replace(self, write=None, payload=payload, switched=None)
