"""Compare outputs with golden outputs: per tensor, elementwise |a - b| <= atol + rtol * |b| (numpy.isclose)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Tuple

import numpy as np


@dataclass
class OutputStats:
    """How one output tensor compares with its golden value.

    Attributes:
        max_abs: largest |a - b| over finite elements.
        max_rel: largest |a - b| / |b| over finite elements with b != 0.
        mismatch_fraction: fraction of elements outside atol + rtol * |b| (NaN/Inf count as mismatches).
        new_nonfinite: elements that are NaN/Inf in the output but finite in the golden value.
        passed: whether this tensor is within tolerance.
        problem: why it failed, or "".
    """

    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatch_fraction: float = 0.0
    new_nonfinite: int = 0
    passed: bool = True
    problem: str = ""


def compare_tensor(
    actual: np.ndarray, golden: np.ndarray, atol: float, rtol: float, max_mismatch_fraction: float
) -> OutputStats:
    """Compare one tensor (see OutputStats); a shape mismatch fails at once."""
    a = np.asarray(actual)
    b = np.asarray(golden)
    if a.shape != b.shape:
        return OutputStats(
            passed=False, mismatch_fraction=1.0, problem=f"shape {list(a.shape)} != golden {list(b.shape)}"
        )
    if a.size == 0:
        return OutputStats()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return _stats(a64, b64, atol, rtol, max_mismatch_fraction)


def _stats(a64: np.ndarray, b64: np.ndarray, atol: float, rtol: float, max_mismatch_fraction: float) -> OutputStats:
    close = np.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True)
    new_nonfinite = int(np.count_nonzero(~np.isfinite(a64) & np.isfinite(b64)))
    finite = np.isfinite(a64) & np.isfinite(b64)
    diff = np.abs(a64 - b64)
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    nz = finite & (b64 != 0)
    max_rel = float((diff[nz] / np.abs(b64[nz])).max()) if nz.any() else 0.0
    fraction = float(np.count_nonzero(~close)) / a64.size
    stats = OutputStats(max_abs, max_rel, fraction, new_nonfinite)
    if new_nonfinite:
        stats.passed, stats.problem = False, f"{new_nonfinite} NaN/Inf values where the golden output is finite"
    elif fraction > max_mismatch_fraction:
        stats.passed, stats.problem = (
            False,
            f"{fraction:.2%} of values outside atol={atol} rtol={rtol} "
            f"(max abs err {max_abs:.3g}, max rel err {max_rel:.3g})",
        )
    return stats


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    atol: float,
    rtol: float,
    max_mismatch_fraction: float,
) -> Tuple[bool, Dict[str, Dict], List[str]]:
    """Compare every output in ``actual`` with ``golden`` by name.

    Returns:
        (all within tolerance; ``{name: OutputStats as dict}``; one "name: problem" line per failing output).

    Raises:
        KeyError: when an output has no golden value.
    """
    stats: Dict[str, Dict] = {}
    problems: List[str] = []
    for name, value in actual.items():
        s = compare_tensor(value, golden[name], atol, rtol, max_mismatch_fraction)
        stats[name] = asdict(s)
        if not s.passed:
            problems.append(f"{name}: {s.problem}")
    return not problems, stats, problems
