"""Run ``python -m runner`` with the given overrides in this process, then print the heavy modules it imported.

The last line is ``imported: NAME ...`` (empty after the colon when none): which of NumPy, ONNX, ONNX Runtime,
onnx-graphsurgeon and the precision and reduce modes' modules the run loaded. A run of no model (``mode=repeat
checker.cmd=true``) should load none of them. The exit code is the run's. Used by
``tests/runner/run/test_startup.py`` and ``benchmarks/startup.py``.

Usage: python scripts/imported_modules.py mode=repeat until=1 checker.cmd=true
"""

from __future__ import annotations

import sys

#: the modules a run of no model has no use for
HEAVY = ("numpy", "onnx", "onnxruntime", "onnx_graphsurgeon", "strategies.precision", "strategies.reduce")


def main() -> int:
    """Run the runner's command line on this script's arguments; return its exit code."""
    sys.argv = ["runner", *sys.argv[1:]]
    from runner.__main__ import cli

    code = cli()
    print("\nimported:", " ".join(m for m in HEAVY if m in sys.modules))
    return code


if __name__ == "__main__":
    sys.exit(main())
