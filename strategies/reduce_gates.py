"""``mode=reduce``'s checks outside the search: the user's model as given (it must fail), the control
candidate that tells a culprit from a check that fails on anything, and Polygraphy's ``min_good`` pick."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

import onnx

from runner.candidates import Candidate, Verdict
from runner.errors import NothingToDoError
from runner.graph.load import save_model
from runner.write_guard import check_write
from strategies.onnx_search import Units


def original_candidate(
    model: onnx.ModelProto, files: Sequence[Path], save_opts: Dict[str, Any], fingerprint: str, nodes: int
) -> Candidate:
    """The user's model exactly as given: a byte copy of its one file; with external data, saved again.

    Args:
        model: the model as loaded. files: its files (the model, then its external data).
        save_opts: ``save_model``'s options (``external_data`` is forced on for several files).
        fingerprint: the model's fingerprint (the candidate's key). nodes: its node count.
    """
    single_file = files[0] if len(files) == 1 else None

    def write(path: Path) -> None:
        if single_file is not None:
            check_write(path, "your model's copy")
            shutil.copyfile(single_file, path)
        else:  # saving with external data moves tensors out of the proto it is given: save a copy
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            save_model(copy, path, **{**save_opts, "external_data": True})

    return Candidate(
        f"{fingerprint}:original", f"your model as given: {nodes} nodes", write, {"nodes": nodes}, payload=lambda: model
    )


def original_passed(
    verdict: Verdict, hint: str = "check the check command (or its fail_codes/fail_regex) on the model first"
) -> NoReturn:
    """The user's model passed: there is nothing to reduce.

    Args:
        verdict: the passing verdict on the model as given.
        hint: what to look at, from the checker (``Checker.fix_hint``); a compare check names its tolerances.

    Raises:
        NothingToDoError: always, with what to change (the compare checker's tolerances, or the check).
    """
    if verdict.outputs is not None:  # an in-process compare: its tolerances, not a command
        hint = (
            f"the compare checker finds the outputs within tolerance ({verdict.reason}); tighten "
            "checker.atol/rtol, pick the statistic (checker.check_error_stat) or the backend that fails"
        )
    raise NothingToDoError(
        f"the check passes on the unreduced model (your file as given), so there is no failure to reduce; {hint}"
    )


def control_units(order: Sequence[int], final: Units, closure: Callable[[Units], Units]) -> Optional[Units]:
    """One unit's candidate (``closure`` of it) that holds none of ``final``'s nodes: the last such unit
    in the search ``order``; None when every candidate would hold some of them."""
    for u in reversed(order):
        if u not in final:
            units = closure(frozenset([u]))
            if not units & final:
                return units
    return None


def min_good_set(final: Units, passing: List[Tuple[int, Units]]) -> Optional[Units]:
    """Polygraphy's ``--min-good`` choice among the ``(size, units)`` that passed: the largest smaller
    than ``final``, else the smallest at least as large; None when none passed."""
    size = len(final)
    smaller = [p for p in passing if p[0] < size]
    if smaller:
        return max(smaller, key=lambda p: p[0])[1]
    larger = [p for p in passing if p[0] >= size]
    return min(larger, key=lambda p: p[0])[1] if larger else None
