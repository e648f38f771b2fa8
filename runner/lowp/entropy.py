"""Entropy calibration as TensorRT computes it, for every candidate threshold at once.

TensorRT's entropy calibrator (Migacz, "8-bit Inference with TensorRT", GTC 2017; NVIDIA's
pytorch-quantization ``_compute_amax_entropy`` is its reference in Python) picks, for each tensor, the
``|x|`` threshold whose int8 quantization loses the least information: over a histogram of ``|x|`` (the
zero bin set to the next one's count, so that a ReLU's zeros do not decide), for each candidate end ``i``
(128 to the number of bins) the reference distribution P is the first ``i`` bins with every count past
them added to the last; the candidate Q merges those ``i`` bins into 128 levels (bin ``k`` into level
``floor(128 k / i)``) and spreads each level's count evenly over its non-empty bins; the threshold is the
end of the ``i`` whose KL(P || Q) is least (the last such ``i``).

ONNX Runtime's calibrator loops over the candidates in Python (a detector's 331 tensors: 189-300 s). Here
the KL divergence of every candidate comes from prefix sums: with ``S_g`` and ``N_g`` a level's count and
non-empty bins, ``T`` every count, ``C`` the first ``i`` bins' and ``O = T - C`` the outliers,
``T * KL = sum_{k < i-1} b log b + p log p - sum_g S_g log(S_g / N_g) - O log(S_last / N_last)
+ T log(C / T)`` with ``p = b_{i-1} + O`` (infinite when bin ``i-1`` is empty and there are outliers):
a few array operations per tensor.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

#: the int8 levels of one sign (TensorRT's 128 for signed int8)
LEVELS = 128


def fold(hist: np.ndarray, edges: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """A histogram symmetric about 0 (ONNX Runtime's collector: ``[-t, t]``, an even number of bins) as a
    histogram of ``|x|``: (counts, edges from 0), half as many bins.

    Raises:
        ValueError: the histogram is not symmetric about 0 with an even number of bins.
    """
    n = len(hist)
    if n % 2 or len(edges) != n + 1:
        raise ValueError(f"a symmetric histogram has an even number of bins and one more edge, got {n}, {len(edges)}")
    half = n // 2
    width = float(edges[-1] - edges[0]) / n
    if abs(float(edges[half])) > 1e-6 * max(width * n, 1e-30):
        raise ValueError("the histogram is not centred on 0")
    counts = hist[half:].astype(np.float64) + hist[:half][::-1].astype(np.float64)
    return counts, np.asarray(edges[half:], dtype=np.float64)


def entropy_amax(counts: np.ndarray, edges: np.ndarray, start: int = LEVELS) -> float:
    """The ``|x|`` threshold of TensorRT's entropy calibration over a histogram of ``|x|``.

    Args:
        counts: ``[n]`` counts of ``|x|`` per bin, first bin at 0.
        edges: ``[n + 1]`` bin edges.
        start: the first candidate end (128: a threshold keeps at least as many bins as levels).

    Returns:
        The threshold (an edge of ``edges``); the last edge when the histogram has ``start`` bins or
        fewer, or is empty.
    """
    b = np.asarray(counts, dtype=np.float64).copy()
    n = len(b)
    if n <= start or b.sum() <= 0:
        return float(edges[-1])
    b[0] = b[1]  # as NVIDIA's reference: a spike of zeros (ReLU outputs) must not decide
    total = b.sum()
    ends = np.arange(start, n + 1)  # candidate i: the first i bins kept
    cb = np.concatenate([[0.0], np.cumsum(b)])  # cb[k] = sum of b[:k]
    cn = np.concatenate([[0], np.cumsum(b > 0)])  # non-empty bins among b[:k]
    with np.errstate(divide="ignore", invalid="ignore"):
        blogb = np.where(b > 0, b * np.log(np.where(b > 0, b, 1.0)), 0.0)
    cl = np.concatenate([[0.0], np.cumsum(blogb)])
    # level g of candidate i holds bins [ceil(g i / 128), ceil((g + 1) i / 128))
    g = np.arange(LEVELS + 1)
    bounds = (g[None, :] * ends[:, None] + LEVELS - 1) // LEVELS  # [candidates, LEVELS + 1]
    sums = cb[bounds[:, 1:]] - cb[bounds[:, :-1]]
    nonempty = cn[bounds[:, 1:]] - cn[bounds[:, :-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        levels = np.where(sums > 0, sums * np.log(sums / np.maximum(nonempty, 1)), 0.0).sum(axis=1)
        kept = cb[ends]  # C: counts of the first i bins
        outliers = total - kept
        last = b[ends - 1]
        p_last = last + outliers
        plogp = cl[ends - 1] + np.where(p_last > 0, p_last * np.log(np.where(p_last > 0, p_last, 1.0)), 0.0)
        q_last = np.where(nonempty[:, -1] > 0, sums[:, -1] / np.maximum(nonempty[:, -1], 1), 0.0)
        outlier_term = np.where(outliers > 0, outliers * np.log(np.where(q_last > 0, q_last, 1.0)), 0.0)
        kl = (plogp - levels - outlier_term) / total + np.log(kept / total)
    kl = np.where((last == 0) & (outliers > 0), np.inf, kl)  # Q is 0 where P holds the outliers
    kl = np.where(kept > 0, kl, np.inf)
    if not np.isfinite(kl).any():
        return float(edges[-1])
    best = len(kl) - 1 - int(np.argmin(kl[::-1]))  # the last of the least, as the reference
    return float(edges[ends[best]])
