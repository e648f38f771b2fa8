"""Entropy calibration (``runner.lowp.entropy``): the threshold NVIDIA's reference computes candidate by
candidate, from prefix sums; and a symmetric histogram folded into one of ``|x|``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from runner.lowp.entropy import entropy_amax, fold


def reference_amax(counts: np.ndarray, edges: np.ndarray, start: int = 128) -> float:
    """pytorch-quantization's ``_compute_amax_entropy`` (NVIDIA's reference of TensorRT's entropy
    calibration), loop for loop, with scipy's entropy written out."""
    bins = np.asarray(counts, dtype=np.float64).copy()
    bins[0] = bins[1]
    nbins = 128
    divergences = []
    for i in range(start, len(bins) + 1):
        new_density_counts = np.zeros(nbins, dtype=np.float64)
        space = np.linspace(0, i, num=nbins + 1)
        digitized = np.digitize(range(i), space) - 1
        digitized[bins[:i] == 0] = -1
        for idx, d in enumerate(digitized):
            if d != -1:
                new_density_counts[d] += bins[idx]
        for key, val in Counter(digitized).items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = np.array([new_density_counts[d] if d != -1 else 0.0 for d in digitized])
        reference = np.array(bins[:i])
        reference[-1] += np.sum(bins[i:])
        p, q = reference / reference.sum(), new_density / new_density.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(p / q), 0.0)
        divergences.append(float(np.sum(terms)))
    found = np.array(divergences)
    last = len(found) - 1 - int(np.argmin(found[::-1]))
    return float(edges[last + start])


@pytest.mark.parametrize("seed", range(12))
def test_the_threshold_is_the_references(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(130, 400))
    kind = seed % 4
    if kind == 0:  # a long tail
        counts = np.floor(1e4 * np.exp(-np.arange(n) / rng.uniform(5, 80))).astype(float)
    elif kind == 1:  # sparse, with empty bins and far outliers
        counts = rng.poisson(3, n).astype(float) * (rng.random(n) < 0.6)
        counts[-3:] = [0, 1, 0]
    elif kind == 2:  # a ReLU's spike of zeros
        counts = rng.poisson(50 * np.exp(-np.arange(n) / 30)).astype(float)
        counts[0] = 1e6
    else:
        counts = rng.integers(0, 100, n).astype(float)
    edges = np.linspace(0, rng.uniform(0.5, 50), n + 1)
    assert entropy_amax(counts, edges) == pytest.approx(reference_amax(counts, edges), rel=1e-12)


def test_a_histogram_too_short_to_choose_keeps_everything():
    edges = np.linspace(0, 3, 101)
    assert entropy_amax(np.ones(100), edges) == 3.0
    assert entropy_amax(np.zeros(300), np.linspace(0, 3, 301)) == 3.0


def test_a_symmetric_histogram_folds_into_one_of_magnitudes():
    values = np.random.default_rng(0).standard_normal(10000)
    hist, edges = np.histogram(values, 20, range=(-4, 4))
    counts, folded = fold(hist, edges)
    assert counts.sum() == hist.sum() and len(counts) == 10 and folded[0] == 0 and folded[-1] == 4
    expected, _ = np.histogram(np.abs(values), 10, range=(0, 4))
    assert np.array_equal(counts, expected)
    with pytest.raises(ValueError):
        fold(hist[:-1], edges[:-1])
