"""Writing large models one initializer at a time (``save_model``'s streamed path): the file loads as
the model it was written from, on real models (their weights as initializers) and one with If bodies."""

from __future__ import annotations

import onnx
import pytest

from runner.graph import load
from runner.graph.constants import constants_to_initializers
from tests.helpers.models import CLASSIFIER, DETECTOR, VAD_IF


@pytest.mark.parametrize("source", [DETECTOR, CLASSIFIER, VAD_IF], ids=["detector", "classifier", "vad_with_if"])
def test_a_streamed_model_file_loads_as_the_model(source, tmp_path, monkeypatch):
    monkeypatch.setattr(load, "STREAM_BYTES", 1)  # every model counts as large
    model = constants_to_initializers(onnx.load(str(source)))
    assert model.graph.initializer
    path = load.save_model(model, tmp_path / "streamed.onnx")
    assert path.read_bytes() != model.SerializeToString()  # written in pieces, not by onnx.save_model
    again = onnx.load(str(path))
    assert again.SerializeToString() == model.SerializeToString()
    load.check_saved(path)
