"""Compare outputs with golden outputs, per tensor, by one error statistic (Polygraphy's comparator).

Statistics (``check_error_stat``):
    elemwise: every element within ``|a - b| <= atol + rtol * |b|`` (numpy.isclose), allowing
        ``max_mismatch_fraction`` of elements outside (this project's default rule).
    max, mean, median, quantile: Polygraphy's ``--check-error-stat``: the statistic of the absolute
        errors ``|a - b|`` within ``atol``, or that of the relative errors ``|a - b| / |b|`` (an
        epsilon of 2.2e-16 where ``b`` is 0) within ``rtol``; ``quantile`` takes ``error_quantile``.
    rel_l2: the scale-free ``||a - b||_2 / ||b||_2 <= rtol``, for tensors of any magnitude.

A NaN or Inf where the golden value is finite fails whatever the statistic. Tolerances are numbers
or maps ``{output name: value, default: value}``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import numpy as np

from runner.errors import ConfigError

log = logging.getLogger(__name__)

STATS = ("elemwise", "max", "mean", "median", "quantile", "rel_l2")
#: added to zero golden values for relative errors, as Polygraphy does
EPSILON = 2.220446049250313e-16

Tolerance = Union[float, Mapping[str, float]]


@dataclass
class OutputStats:
    """How one output tensor compares with its golden value (errors over elements finite in both).

    Attributes:
        max_abs: largest ``|a - b|``.
        max_rel: largest ``|a - b| / |b|`` over elements with ``b != 0``.
        mean_abs, median_abs: mean and median of ``|a - b|``.
        rel_l2: ``||a - b||_2 / ||b||_2`` (0 when both norms are 0, inf when only ``b``'s is).
        cosine: cosine similarity of ``a`` and ``b`` (1 when both are all zeros).
        sqnr_db: signal-to-quantization-noise ratio ``10 log10(||b||^2 / ||a - b||^2)`` in dB,
            ``-20 log10(rel_l2)``; None when the tensors are equal or the error is not finite
            (JSON has no inf). int8 layers score about 20-40 dB.
        mismatch_fraction: fraction of elements outside ``atol + rtol * |b|`` (NaN/Inf count as
            mismatches).
        nan, inf: NaN and Inf elements in the output.
        new_nonfinite: elements NaN/Inf in the output but finite in the golden value.
        statistic: the value the verdict compared (for elemwise, the mismatch fraction).
        limit: the largest ``statistic`` that passes (rtol for rel_l2, the mismatch fraction allowed for elemwise,
            atol for the others, which also pass within rtol), None where a NaN/Inf decided.
        measure: what ``statistic`` is, for figures ("relative L2 error", "fraction of values mismatched", ...).
        passed: whether this tensor is within tolerance.
        problem: why it failed, or "".
    """

    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    median_abs: Optional[float] = 0.0  # None: not computed (compare_tensor's light)
    rel_l2: float = 0.0
    cosine: float = 1.0
    sqnr_db: Optional[float] = None
    mismatch_fraction: Optional[float] = 0.0  # None: not computed (compare_tensor's light)
    nan: int = 0
    inf: int = 0
    new_nonfinite: int = 0
    statistic: float = 0.0
    limit: Optional[float] = None
    measure: str = ""
    passed: bool = True
    problem: str = ""


@dataclass(frozen=True)
class Tolerances:
    """The comparison rule of a checker.

    Args:
        atol: absolute tolerance, or ``{output: value, default: value}``, or the same as a list of
            ``[output, value]`` pairs (for names a Hydra map key cannot hold, such as ``onnx::Conv_5``).
        rtol: relative tolerance, or a map as ``atol``.
        stat: one of ``STATS``.
        quantile: the quantile for ``stat="quantile"`` (0 to 1).
        max_mismatch_fraction: elements allowed outside tolerance with ``stat="elemwise"``.

    Raises:
        ConfigError: a negative tolerance, an unknown statistic, a quantile outside [0, 1], or a
            fraction outside [0, 1).
    """

    atol: Tolerance = 1e-3
    rtol: Tolerance = 1e-3
    stat: str = "elemwise"
    quantile: float = 0.5
    max_mismatch_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):  # [[name, value], ...]: names Hydra's map keys cannot hold
                if not all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in value):
                    raise ConfigError(
                        f"checker.{name}={value!r}: give pairs [['output name', number], ...], e.g. "
                        f"'checker.{name}=[[\"onnx::Conv_5\",0.1],[default,1e-3]]'"
                    )
                value = {p[0]: p[1] for p in value}
                object.__setattr__(self, name, value)  # frozen: set once, here
            values = list(value.values()) if isinstance(value, Mapping) else [value]
            if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 for v in values):  # NaN too
                raise ConfigError(
                    f"checker.{name}={value!r}: give a number >= 0 or a map "
                    f"{{output_name: number, default: number}}, e.g. 'checker.{name}={{logits: 0.1, default: 1e-3}}'"
                )
        if self.stat not in STATS:
            raise ConfigError(f"checker.check_error_stat={self.stat!r}; use one of {', '.join(STATS)}")
        if not 0 <= self.quantile <= 1:
            raise ConfigError(f"checker.error_quantile={self.quantile} must be in [0, 1]")
        if not 0 <= self.max_mismatch_fraction < 1:
            raise ConfigError(f"checker.max_mismatch_fraction={self.max_mismatch_fraction} must be in [0, 1)")

    def polygraphy_args(self) -> Optional[List[str]]:
        """This rule as ``polygraphy run``'s comparator options (``--atol``, ``--rtol`` per output,
        ``--check-error-stat``, ``--error-quantile``), or None where Polygraphy has no equal (``rel_l2``,
        ``max_mismatch_fraction``)."""
        if self.stat == "rel_l2" or self.max_mismatch_fraction:
            return None
        args: List[str] = []
        for flag, value in (("--atol", self.atol), ("--rtol", self.rtol)):
            items = value.items() if isinstance(value, Mapping) else [("default", value)]
            args += [flag, *(f"{v:g}" if name == "default" else f"{name}:{v:g}" for name, v in items)]
        if self.stat != "elemwise":
            args += ["--check-error-stat", self.stat]
        if self.stat == "quantile":
            args += ["--error-quantile", f"{self.quantile:g}"]
        return args

    def scaled(self, factor: float) -> Tolerances:
        """This rule with every atol and rtol multiplied by ``factor`` (0 to 1: a tighter rule, for a
        search with margin, ``runner.checkers.compare.arithmetics``); the statistic and fraction unchanged."""

        def scale(value: Tolerance) -> Tolerance:
            if isinstance(value, Mapping):
                return {k: float(v) * factor for k, v in value.items()}
            return float(value) * factor

        return replace(self, atol=scale(self.atol), rtol=scale(self.rtol))

    def for_output(self, name: str) -> Tuple[float, float]:
        """(atol, rtol) for the output ``name``: its own entry, else ``default``, else 1e-3."""

        def pick(value: Tolerance) -> float:
            if isinstance(value, Mapping):
                return float(value.get(name, value.get("default", 1e-3)))
            return float(value)

        return pick(self.atol), pick(self.rtol)


def _norm(x: np.ndarray) -> float:
    """The L2 norm of a 1-D array by numpy's own loop: ``np.linalg.norm`` calls BLAS, whose threads
    spin against ONNX Runtime's (on 2 cores a layerwise run took 5x as long next to another)."""
    return float(np.sqrt(np.einsum("i,i->", x, x)))


def _errors(a64: np.ndarray, b64: np.ndarray, median: bool = True) -> Dict[str, Any]:
    finite = np.isfinite(a64) & np.isfinite(b64)
    a, b = (a64.ravel(), b64.ravel()) if finite.all() else (a64[finite], b64[finite])  # no copies when all finite
    diff = np.abs(a - b)
    abs_b = np.abs(b)
    nz = b != 0
    rel = diff / np.where(nz, abs_b, EPSILON)
    norm_b, norm_d, norm_a = _norm(b), _norm(diff), _norm(a)
    if norm_b == 0:
        rel_l2 = 0.0 if norm_d == 0 else float("inf")
    else:
        rel_l2 = norm_d / norm_b
    if norm_a == 0 and norm_b == 0:
        cosine = 1.0
    elif norm_a == 0 or norm_b == 0:
        cosine = 0.0
    else:
        cosine = float(np.einsum("i,i->", a, b)) / (norm_a * norm_b)
    return {
        "diff": diff,
        "rel": rel,
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "max_rel": float(np.max(rel, where=nz, initial=0.0)),
        "mean_abs": float(diff.mean()) if diff.size else 0.0,
        "median_abs": (float(np.median(diff)) if diff.size else 0.0) if median else None,
        "rel_l2": rel_l2,
        "cosine": cosine,
    }


def _statistic(values: np.ndarray, stat: str, quantile: float) -> float:
    if values.size == 0:
        return 0.0
    if stat == "max":
        return float(values.max())
    if stat == "mean":
        return float(values.mean())
    if stat == "median":
        return float(np.median(values))
    return float(np.quantile(values, quantile))


def _sqnr_db(rel_l2: float) -> Optional[float]:
    """SQNR in dB from a relative L2 error; None for 0, NaN and inf."""
    if not np.isfinite(rel_l2) or rel_l2 == 0:
        return None
    return float(-20.0 * np.log10(rel_l2))


def compare_tensor(
    actual: np.ndarray, golden: np.ndarray, atol: float, rtol: float, rule: Tolerances, light: bool = False
) -> OutputStats:
    """Compare one tensor by ``rule.stat`` (see the module docstring); a shape mismatch fails at once.

    Args:
        actual: the candidate's output.
        golden: the golden output, same shape.
        atol: this output's absolute tolerance.
        rtol: this output's relative tolerance.
        rule: the statistic, quantile and mismatch fraction.
        light: skip what only a checker's report shows, for layerwise's thousands of tensors:
            ``median_abs`` is None and, unless ``rule.stat`` is elemwise, ``mismatch_fraction`` too.
            The verdict is the same.
    """
    a, b = np.asarray(actual), np.asarray(golden)
    if a.shape != b.shape:
        return OutputStats(
            passed=False, mismatch_fraction=1.0, problem=f"shape {list(a.shape)} != golden {list(b.shape)}"
        )
    if a.size == 0:
        return OutputStats()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        e = _errors(a64, b64, median=not light)
        mismatch: Optional[float] = None
        if not light or rule.stat == "elemwise":
            close = np.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True)
            mismatch = float(np.count_nonzero(~close)) / a64.size
    stats = OutputStats(
        max_abs=e["max_abs"],
        max_rel=e["max_rel"],
        mean_abs=e["mean_abs"],
        median_abs=e["median_abs"],
        rel_l2=e["rel_l2"],
        cosine=e["cosine"],
        sqnr_db=_sqnr_db(e["rel_l2"]),
        mismatch_fraction=mismatch,
        nan=int(np.count_nonzero(np.isnan(a64))),
        inf=int(np.count_nonzero(np.isinf(a64))),
        new_nonfinite=int(np.count_nonzero(~np.isfinite(a64) & np.isfinite(b64))),
    )
    if stats.new_nonfinite:
        stats.passed, stats.problem = False, f"{stats.new_nonfinite} NaN/Inf values where the golden output is finite"
        return stats
    if rule.stat == "elemwise":
        assert mismatch is not None  # computed for elemwise, light or not
        stats.statistic, stats.limit, stats.measure = (
            mismatch,
            rule.max_mismatch_fraction,
            "fraction of values mismatched",
        )
        if mismatch > rule.max_mismatch_fraction:
            stats.passed = False
            stats.problem = (
                f"{mismatch:.2%} of values outside atol={atol} rtol={rtol} "
                f"(max abs err {stats.max_abs:.3g}, max rel err {stats.max_rel:.3g})"
            )
    elif rule.stat == "rel_l2":
        stats.statistic, stats.limit, stats.measure = stats.rel_l2, rtol, "relative L2 error"
        if not stats.rel_l2 <= rtol:
            stats.passed, stats.problem = False, f"relative L2 error {stats.rel_l2:.3g} > rtol={rtol}"
    else:
        abs_stat = _statistic(e["diff"], rule.stat, rule.quantile)
        rel_stat = _statistic(e["rel"], rule.stat, rule.quantile)
        stats.statistic, stats.limit, stats.measure = abs_stat, atol, f"{rule.stat} absolute error"
        if abs_stat > atol and rel_stat > rtol:  # Polygraphy: within either tolerance passes
            stats.passed = False
            stats.problem = (
                f"{rule.stat} abs err {abs_stat:.3g} > atol={atol} and {rule.stat} rel err {rel_stat:.3g} > rtol={rtol}"
            )
    return stats


def compare_outputs(
    actual: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray], rule: Tolerances
) -> Tuple[bool, Dict[str, Dict[str, Any]], List[str]]:
    """Compare every output in ``actual`` with ``golden`` by name.

    Returns:
        (all within tolerance; ``{name: OutputStats as dict}``; one "name: problem" line per failing output).

    Raises:
        KeyError: when an output has no golden value.
    """
    stats: Dict[str, Dict[str, Any]] = {}
    problems: List[str] = []
    for name, value in actual.items():
        atol, rtol = rule.for_output(name)
        s = compare_tensor(value, golden[name], atol, rtol, rule)
        stats[name] = asdict(s)
        if not s.passed:
            problems.append(f"{name}: {s.problem}")
    return not problems, stats, problems


def unknown_names(rule: Tolerances, tensors: Iterable[str]) -> List[str]:
    """The output names ``rule``'s tolerance maps give that are not among ``tensors`` (``default`` aside)."""
    known = set(tensors) | {"default"}
    named = [k for t in (rule.atol, rule.rtol) if isinstance(t, Mapping) for k in t]
    return sorted({k for k in named if k not in known})


def describe(name: str, st: Dict[str, Any]) -> str:
    """One output's errors for the log: max abs and rel, rel L2, cosine, mismatches, NaN/Inf."""
    return (
        f"{name}: max abs err {st['max_abs']:.3g}, max rel err {st['max_rel']:.3g}, rel L2 {st['rel_l2']:.3g}, "
        f"cosine {st['cosine']:.6f}, mismatched {100 * st['mismatch_fraction']:.2f}%, NaN {st['nan']}, Inf {st['inf']}"
    )


def log_outputs(where: str, stats: Dict[str, Dict[str, Any]]) -> None:
    """Log one sample's comparison (``compare_outputs``'s stats): how many outputs passed and the worst
    (info), then every output (debug). ``where``: the line's prefix ("Iteration 3, sample 1")."""
    if stats:
        worst = max(stats, key=lambda n: (not stats[n]["passed"], stats[n]["statistic"], stats[n]["max_abs"]))
        failing = sum(1 for s in stats.values() if not s["passed"])
        log.info(
            "%s: %d of %d outputs within tolerance; worst %s",
            where,
            len(stats) - failing,
            len(stats),
            describe(worst, stats[worst]),
        )
    for name, st in stats.items():
        log.debug("%s: %s", where, describe(name, st))
