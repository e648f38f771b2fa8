"""The calibration cache (``calibration.cache``) and entropy calibration as TensorRT computes it, on the planted
int8 outlier model: ranges read back as written, refused when made otherwise, never overwritten."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runner.errors import ConfigError
from runner.lowp.calibration import calibrate
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import prepare_int8
from tests.helpers.int8 import conv_outlier_model, samples


def ranges(cal) -> dict:
    return {name: tuple(float(np.ravel(v)[0]) for v in data.range_value) for name, data in cal.ranges.data.items()}


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_ranges_are_read_back_as_calibrated(tmp_path, method):
    model, feeds = prepare_int8(conv_outlier_model()), list(samples())
    cache = tmp_path / "cal.json"
    options = QuantOptions(method=method, cache=str(cache))
    first = calibrate(model, feeds, options)
    assert not first.cached and cache.is_file()
    written = cache.read_bytes()
    again = calibrate(model, feeds, options)
    assert again.cached and ranges(again).keys() == ranges(first).keys()
    for name, bounds in ranges(first).items():
        assert ranges(again)[name] == pytest.approx(bounds, rel=1e-6)
    assert again.summary()["cached"] is True and cache.read_bytes() == written, "a cache read is not rewritten"
    data = json.loads(written)
    assert data["format"] == "onnx-debug-runner calibration cache" and data["identity"]["method"] == method


def test_a_cache_of_other_samples_or_options_is_refused(tmp_path):
    model, feeds = prepare_int8(conv_outlier_model()), list(samples())
    cache = tmp_path / "cal.json"
    calibrate(model, feeds, QuantOptions(cache=str(cache)))
    with pytest.raises(ConfigError, match=r"made with method=minmax \(this run: entropy\)") as refused:
        calibrate(model, feeds, QuantOptions(method="entropy", cache=str(cache)))
    assert "delete" not in str(refused.value), "the refusal names the file's method and never invites deleting"
    with pytest.raises(ConfigError, match=rf"made with samples={len(feeds)} \(this run: 2\), other samples"):
        calibrate(model, feeds[:2], QuantOptions(cache=str(cache)))
    other = tmp_path / "other.json"
    other.write_text('{"format": "something else"}')
    with pytest.raises(ConfigError, match="no calibration cache"):
        calibrate(model, feeds, QuantOptions(cache=str(other)))


def test_entropy_thresholds_are_within_the_tensors_ranges():
    """TensorRT's entropy thresholds lie within each tensor's own range (here the outlier channel holds an
    eighth of the values: it is kept)."""
    model, feeds = prepare_int8(conv_outlier_model()), list(samples())
    minmax = ranges(calibrate(model, feeds, QuantOptions()))
    entropy = ranges(calibrate(model, feeds, QuantOptions(method="entropy")))
    assert minmax.keys() == entropy.keys()
    for name, (lo, hi) in entropy.items():
        assert minmax[name][0] <= lo <= hi <= minmax[name][1] + 1e-6
    assert np.isfinite([v for r in entropy.values() for v in r]).all()
