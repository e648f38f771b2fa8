"""The compare checker (``checker=compare``) and what serves it alone: tolerances and statistics
(``tolerance``), detections, the arithmetics an answer is verified on, the noise floor, golden values
through Casts, lowering a candidate to the checked precision, the reference run, switched runs, and
``Comparison``, the record of how it runs and judges that layerwise, reduce and the rankings read.

``CompareChecker`` is imported from ``checker`` when first asked for: the satellites (``tolerance``,
used by the layerwise comparison too) import without the checker's own imports.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CompareChecker"]


def __getattr__(name: str) -> Any:
    if name == "CompareChecker":
        from runner.checkers.compare.checker import CompareChecker

        return CompareChecker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
