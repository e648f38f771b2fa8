"""User-facing error types: one per kind of bad input, each printed as one line at the entry point.

Each message says what is wrong and how to fix it; the entry point prints it, writes it into
``summary.json`` as ``status`` and exits with ``exit_code``.
"""

from __future__ import annotations

from typing import Any, Dict


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, for a one-line error; its type's name when empty."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class RunnerError(Exception):
    """Base class of every error the entry point reports as one line (exit code 2)."""

    exit_code = 2


class ConfigError(RunnerError):
    """A config value is missing, out of range or inconsistent with the chosen mode."""


class ModelError(RunnerError):
    """The model file is missing, unreadable, not ONNX, or not a well-formed graph."""


class ShapeError(ModelError):
    """A tensor that must become a graph input or output has no known dtype or shape."""


class InvalidCandidateError(RunnerError):
    """A model the tool built (a conversion, a mixed-precision or reduced candidate) is invalid: the
    tool's own defect. The run stops before checking it, and no verdict is recorded for it.

    Attributes:
        model: the invalid model (an ``onnx.ModelProto``), for the defect report; None when the
            conversion failed before making one.
    """

    def __init__(self, message: str, model: object = None):
        super().__init__(message)
        self.model = model


class CheckStartError(RunnerError):
    """The check could not be started (command not found, no terminal for interactive checks)."""


class NothingToDoError(RunnerError):
    """The starting point already gives the wanted verdict (e.g. the full model passes the check)."""


class ArtifactError(RunnerError):
    """An artifact or output location cannot be written."""


class MissingExtraError(RunnerError):
    """An optional dependency (e.g. TensorRT) is not installed."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the Python package '{package}', which is not installed: "
            f"install the '{extra}' extra (pip install \".[{extra}]\")"
        )


class CheckError(RunnerError):
    """The check cannot give a verdict the run can stand behind (killed by a signal, never passed)."""


class WorkerDiedError(CheckError):
    """The process that ran a check died in it (a crash in the backend, or killed): no verdict."""


class AnswerNotVerifiedError(CheckError):
    """The answer as written (``output=``) did not give the verdict the search found for it when
    loaded back and checked, or does not load: the run cannot stand behind it (exit code 3).

    Attributes:
        verified: the ``answer_verified`` summary of that check.
    """

    exit_code = 3
    status = "answer not verified"

    def __init__(self, message: str, verified: Dict[str, Any]):
        super().__init__(message)
        self.verified = verified


class CheckNeverPassedError(CheckError):
    """No check passed where the search needs a passing one: the check, not the model, is the suspect.

    Attributes:
        tail: the last lines the last check printed.
    """

    status = "check never passed"

    def __init__(self, message: str, tail: str = ""):
        super().__init__(message)
        self.tail = tail


class ApiError(ValueError):
    """A call of the Python API (``runner.api``) that cannot start a run: a key no schema knows, a value of the
    wrong type or with no config form, or a ``run_dir`` that is not a directory. The message is one line naming
    the fix."""
