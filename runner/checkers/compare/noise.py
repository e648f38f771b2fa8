"""The noise floor of an fp32 comparison: errors the reference itself cannot tell from a fault.

Two fp32 runs of one graph that sum in different orders (other fusions, other kernels) differ by
re-association noise, which grows with the values summed: reducing bert_tiny against golden values
blamed 8 nodes of layer 1 for an error of 0.086 on values near 2e5. torch's accuracy minifier blames
only what an fp64 reference confirms; here a failing fp32 candidate is run once more with the other
ONNX Runtime graph optimization level, and a failing output counts as noise when its largest error is
within ``NOISE_K`` times the difference of the two runs, or within ``NOISE_ULPS`` fp32 ulps of the
golden output's largest magnitude.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.backends.base import Backend, make_backend
from runner.errors import ModelError

#: a failing fp32 candidate passes when its errors are within this many times the difference between two
#: runs of it with different reduction orders ...
NOISE_K = 4.0
#: ... or within this many fp32 ulps of the golden output's largest magnitude
NOISE_ULPS = 16.0


class NoiseFloor:
    """Runs failing fp32 candidates in the other reduction order and says when they only show noise.

    Args:
        level: the candidate backend's graph optimization level; the second run takes the other
            ("disable" for any other level, "all" for "disable").
        providers, provider_options: the candidate backend's ONNX Runtime providers and options.
    """

    def __init__(self, level: str, providers: Sequence[str], provider_options: Optional[Mapping[str, Any]]):
        self.level, self.providers, self.provider_options = level, list(providers), provider_options
        self._backend: Optional[Backend] = None

    def floors(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        got: Mapping[str, np.ndarray],
        golden: Mapping[str, np.ndarray],
        stats: Mapping[str, Mapping[str, Any]],
        key: str,
    ) -> Optional[Dict[str, float]]:
        """``{failing output: its noise floor}`` when every failing output's largest error is within its
        floor (the candidate only shows fp32 noise), else None (no failing output, a new NaN/Inf, or an
        error past its floor). One more run of the candidate."""
        failing = [n for n, s in stats.items() if not s["passed"]]
        if not failing or any(stats[n].get("new_nonfinite") for n in failing):
            return None
        if self._backend is None:
            self._backend = make_backend(
                "onnxruntime",
                providers=self.providers,
                graph_optimization_level="disable" if self.level != "disable" else "all",
                provider_options=self.provider_options,
            )
        try:
            again = self._backend.run(model, feeds, key=f"noise:{key}")
        except ModelError:
            return None
        floors: Dict[str, float] = {}
        for name in failing:
            a, b, g = (np.asarray(x, np.float64) for x in (got[name], again[name], golden[name]))
            if a.shape != g.shape or not a.size:
                return None
            scale = float(np.max(np.abs(g[np.isfinite(g)]), initial=0.0))
            floor = max(NOISE_K * float(np.max(np.abs(a - b))), NOISE_ULPS * float(np.finfo(np.float32).eps) * scale)
            if not float(stats[name]["max_abs"]) <= floor:
                return None
            floors[name] = floor
        return floors

    def close(self) -> None:
        """Release the second backend's sessions."""
        if self._backend is not None:
            self._backend.close()
