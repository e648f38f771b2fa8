"""A search's answer, written to ``output=`` and checked once more as written.

The file a user deploys or hands on is the one to check, not the in-memory candidate the search
judged: ``WrittenAnswer`` writes it, loads it back for a last check that is never taken from a
replay (``Candidate.reuse=False``), and holds what ``summary.json`` reports as
``answer_verified``. A verdict other than the one the search found for it raises
``AnswerNotVerifiedError`` (exit 3).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import onnx

from runner.candidates import Candidate, Verdict
from runner.errors import AnswerNotVerifiedError
from runner.graph.load import check_saved, copy_model_file, load_model, save_model
from runner.graph.sessions import loads_on_cpu
from runner.graph.weight_file import maps, weight_bytes
from runner.terminal.stretch import stretch

log = logging.getLogger(__name__)


def save_checked(model: Callable[[], onnx.ModelProto], path: Path, save_opts: Dict[str, Any], size: str) -> None:
    """Write the final model ``model()`` builds (``save_model``), then check the file with onnx.checker
    once the built model is dropped (onnx.checker loads the file whole: a large model is not held twice).

    Raises:
        ArtifactError: the file cannot be written. ModelError: it does not pass onnx.checker.
    """
    built = model()
    with stretch(f"Writing {path.name}", weight_bytes(built)):
        save_model(built, path, **save_opts)
        del built
        check_saved(path)
    log.info("Wrote %s (%s)", path, size)


class WrittenAnswer:
    """The written answer of one search and the check of it as written.

    Args:
        output: where the answer is written.
        save_opts: ``external_data`` and ``threshold`` for ``save_model``.
        expect_pass: the verdict the search found for the answer (precision: pass; reduce: fail).
        cpu_load: load the file in ONNX Runtime on CPU (only a model the tool converted: a reduced
            model may be the very one that crashes a backend, and is never loaded in this process).
        must_load: a CPU load failure other than a missing kernel stops the run.

    Attributes:
        facts: ``answer_verified`` for ``summary.json`` (``passed`` once the check has a verdict).
    """

    def __init__(self, output: Path, save_opts: Dict[str, Any], expect_pass: bool, cpu_load: bool, must_load: bool):
        self.output, self.save_opts, self.expect_pass = output, save_opts, expect_pass
        self.cpu_load, self.must_load = cpu_load, must_load
        self.facts: Dict[str, Any] = {"output": str(output)}
        # the written file, loaded once: for ONNX Runtime's CPU load and for its check
        self._written = functools.cache(lambda: load_model(output, "output"))

    def write(self, model: Callable[[], onnx.ModelProto], size: str) -> None:
        """Write the model ``model()`` builds to ``output`` (checked with onnx.checker) and, with
        ``cpu_load``, try loading the file in ONNX Runtime on CPU (once the built model is dropped:
        a large model is not held twice).

        Raises:
            ModelError: the written file does not pass onnx.checker.
            AnswerNotVerifiedError: ``must_load`` and ONNX Runtime refuses the file for a reason
                other than a missing kernel.
        """
        self._written.cache_clear()
        save_checked(model, self.output, self.save_opts, size + "; checking it as written")
        if not self.cpu_load:
            return
        loads = loads_on_cpu(self._written() if maps(self.output.stat().st_size) else self.output)
        self.facts["loads_on_cpu"] = loads is None
        if loads is not None:
            self.facts["cpu_error"] = loads
            if self.must_load and not loads.startswith("no CPU kernel"):
                raise AnswerNotVerifiedError(
                    f"{self.output} was written but ONNX Runtime on CPU cannot load it ({loads}); the run cannot stand "
                    "behind it: please report this with the model",
                    {**self.facts, "passed": False},
                )

    def candidate(self, key: str, size: str, info: Dict[str, Any], as_typed: bool) -> Candidate:
        """The written file as a candidate: loaded back, never reused from a replay.

        Args:
            key: the answer's unit set key (``:answer`` is added).
            size: the answer's size for the label. info: its facts. as_typed: as the mode's candidates.
        """
        output, opts, written = self.output, self.save_opts, self._written

        def write(path: Path) -> None:
            if opts.get("external_data") or output.with_name(output.name + ".data").exists():
                save_model(written(), path, **opts)
            else:  # one file: a copy of it costs no memory
                copy_model_file(output, path)

        return Candidate(
            f"{key}:answer",
            f"the answer as written ({output.name}): {size}",
            write,
            {**info, "answer": str(output)},
            payload=written,
            as_typed=as_typed,
            reuse=False,
            twin=key,
        )

    def held(self, verdict: Verdict) -> None:
        """The check gave the verdict the search found: record it, with the margin the search left and the
        answer's run on each arithmetic it was verified on (``Verdict.verified``).

        Raises:
            AnswerNotVerifiedError: the answer fails its full tolerance on an arithmetic it was verified on.
        """
        self.facts.update(_verdict_facts(verdict), passed=True)
        if verdict.reused:  # its bytes are those of the search's candidate, checked this run (statemachine.same_bytes)
            self.facts["same_bytes"] = True
        log.info("The answer as written gives the verdict the search found for it (%s)", verdict.reason or "no reason")
        if verdict.verified is None:
            return
        margin, on = verdict.verified["margin"], verdict.verified["on"]
        self.facts.update(margin=margin, verified_on=on)
        failing = {name: facts for name, facts in on.items() if not facts["passed"]}
        if failing:
            self.facts["passed"] = False
            said = "; ".join(f"on {name}: {facts.get('reason', 'failed')}" for name, facts in failing.items())
            raise AnswerNotVerifiedError(
                f"{self.output} passes the check as searched (margin {margin:g}) but not at the full tolerance {said}; "
                "the run cannot stand behind it there: raise checker.margin, or search on that arithmetic "
                "(checker.providers, checker.graph_optimization_level)",
                self.facts,
            )
        if on:
            log.info("The answer holds its full tolerance on %s (searched with margin %g)", ", ".join(on), margin)

    def failed(self, verdict: Verdict, again: Optional[Verdict] = None) -> None:
        """The check gave the other verdict.

        Args:
            verdict: the written answer's verdict.
            again: the verdict of the search's own candidate checked once more, when it was: the same
                verdict as the search's says the file differs from its candidate; the other says the
                check is not deterministic. None: not checked again.

        Raises:
            AnswerNotVerifiedError: always, with the facts.
        """
        facts = {**self.facts, **_verdict_facts(verdict), "passed": False}
        found, got = ("passes", "fails") if self.expect_pass else ("fails", "passes")
        if again is None:
            why = "the check is not deterministic, a replayed verdict was wrong, or writing the answer changed it"
        elif again.passed == self.expect_pass:
            facts["candidate_again"] = again.passed
            why = (
                f"its candidate, checked again, still {found}: the model written differs from the candidate the "
                "search checked (the conversion as written, or how the check runs a file)"
            )
        else:
            facts["candidate_again"] = again.passed
            why = (
                f"its candidate, checked again, now {got} too: the check is not deterministic, or the verdict "
                "the search used came from a replay that another check made or someone edited"
            )
        raise AnswerNotVerifiedError(
            f"{self.output} as written {got} the check ({verdict.reason or 'no reason given'}), though the search "
            f"found its candidate {found}: {why}; the run cannot stand behind this answer",
            facts,
        )

    def summary(self) -> Optional[Dict[str, Any]]:
        """``answer_verified`` once the check has its verdict, else None."""
        return self.facts if "passed" in self.facts else None


def _verdict_facts(verdict: Verdict) -> Dict[str, Any]:
    facts: Dict[str, Any] = {"check_passed": verdict.passed, "reason": verdict.reason}
    if verdict.outputs is not None:
        facts["outputs"] = verdict.outputs
    if verdict.error:
        facts["error"] = verdict.error
    return facts
