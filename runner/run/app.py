"""One run: assemble it from the config (``runner.run.assembly``), execute it, write the summary, and
turn every way it can end into one line and an exit code."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import DictConfig

from runner.errors import AnswerNotVerifiedError, CheckNeverPassedError, InvalidCandidateError, RunnerError
from runner.files.report_html import write_report
from runner.jsonio import write_json_atomic
from runner.run.assembly import RunState, assemble, counters, execute, user_overrides
from runner.run.summary import Summary
from runner.terminal import console, logs, signals
from runner.terminal.report import print_table

log = logging.getLogger("runner")


def _say(text: str) -> None:
    """Print to stderr (unless ``silent=true``), and write the line to the log files (``runner.log``
    holds every line a run prints); a closed terminal (SIGHUP) or pipe must not turn into a second error."""
    console.error(text)
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, text, (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            with contextlib.suppress(Exception):
                handler.handle(record)


def _save_invalid(error: InvalidCandidateError, directory: Optional[Path]) -> str:
    """Save the invalid model the tool built into the run directory, for the defect report; the
    words to add to the error ("" when there is none to save or it cannot be written)."""
    if error.model is None or directory is None:
        return ""
    import onnx  # only here: a run that never loads a model imports no ONNX (start-up)

    from runner.graph.load import save_model

    if not isinstance(error.model, onnx.ModelProto):
        return ""
    path = directory / "invalid_candidate.onnx"
    try:
        save_model(error.model, path)
    except Exception as e:  # the report must not hide the error itself
        log.warning("Could not save the invalid model to %s: %s", path, e)
        return ""
    return f" (saved as {path})"


def run(cfg: DictConfig, summary_out: Optional[Dict[str, Any]] = None, started: Optional[float] = None) -> int:
    """Run one job described by ``cfg``; never raises for user errors.

    Args:
        cfg: the composed Hydra config (see ``runner.config.RunConfig``).
        summary_out: filled with this run's summary (also when it is not written: a run refused
            because its directory holds another run's never writes there).
        started: when the run started (``time.monotonic``): ``python -m runner`` gives its launch, so that
            ``summary.json``'s ``wall_s`` and ``budget.seconds`` count the start-up too; None: now.

    Returns:
        The process exit code: 0 when the run finished, 2 for a user error or a check that never
        passed (one line printed), 3 when the written answer failed its own check, 128 + the signal
        when interrupted (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP); ``summary.json`` is written in
        every case.
    """
    summary = Summary(str(cfg.mode.name)) if started is None else Summary(str(cfg.mode.name), started=started)
    state = RunState(cfg, summary)
    code = 0
    with signals.handled(), contextlib.ExitStack() as holds:
        resources = contextlib.ExitStack()
        try:
            state.log = log = logs.settings(cfg.verbose, cfg.get("verbosity"), cfg.get("log_format", ["timestamp"]))
            resources.enter_context(logs.applied(log))
            console.configure(cfg.get("quiet", 0), bool(cfg.get("silent", False)), bool(log.verbose))
            assemble(state, resources, holds)
            execute(state)
        except AnswerNotVerifiedError as e:
            summary.status, summary.error, summary.answer_verified = e.status, str(e), e.verified
            _say(f"error: {e.status}: {e}")
            code = e.exit_code
        except CheckNeverPassedError as e:
            summary.status, summary.error, summary.check_output_tail = e.status, str(e), e.tail
            _say(f"error: {e.status}: {e}" + (f"\nlast check's output:\n{e.tail.rstrip()}" if e.tail.strip() else ""))
            code = e.exit_code
        except InvalidCandidateError as e:
            message = f"{e}{_save_invalid(e, state.directory)}"
            _say(f"error: {message}")
            summary.status = f"error: {message}"
            code = e.exit_code
        except RunnerError as e:
            if state.log.verbose:
                traceback.print_exc()
            _say(f"error: {e}")
            summary.status = f"error: {e}"
            code = e.exit_code
        except OSError as e:  # a file error nothing nearer caught (a full disk, a file made read-only mid-run)
            where = f": {e.filename}" if e.filename else ""
            message = f"{e.strerror or e}{where}; free some space or fix the file's location, then resume"
            _say(f"error: {message}")
            summary.status = f"error: {message}"
            code = 2
        except KeyboardInterrupt as e:
            summary.status = "interrupted"
            _say("interrupted: the replay keeps every finished iteration; resume with replay.load=PATH")
            code = signals.exit_code(e)
        except BaseException as e:
            summary.status = f"internal error: {type(e).__name__}: {e}"
            raise
        finally:
            resources.close()  # the fatal-signal log, the progress bar, the executor and the checker
            counters(state)
            if state.summary_path is not None:  # never a rejected path, never another run's directory
                try:
                    write_json_atomic(state.summary_path, summary.as_json())
                except OSError as e:
                    _say(f"error: cannot write summary={state.summary_path} ({e.strerror}); choose a writable path")
                    code = code or 2
            if state.directory is not None:
                _write_report(state.directory, summary.as_json())
            # leaving the block releases the output plan's reservations, then the run directory's lock
    if summary_out is not None:
        summary_out.update(summary.as_json())
    if code == 0:
        console.result(lambda: _print_quietly(summary.as_json()))
    console.restore()
    return code


def _write_report(directory: Path, summary: Dict[str, Any]) -> None:
    """``report.html`` in the run directory (``runner.files.report_html``); a page that cannot be written costs a
    warning, never the run's answer."""
    try:
        write_report(directory, summary, user_overrides())
    except (OSError, RunnerError, ValueError) as e:  # UnicodeError is a ValueError
        log.warning("Could not write report.html in %s: %s", directory, e)


def _print_quietly(summary: Dict[str, Any]) -> None:
    """Print the final table; a reader that went away (``| head``) silences stdout, not the run."""
    try:
        print_table(summary)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
