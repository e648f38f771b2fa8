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


@pytest.mark.parametrize("source", [DETECTOR, CLASSIFIER, VAD_IF], ids=["detector", "classifier", "vad_with_if"])
def test_a_model_file_read_piece_by_piece_is_the_model(source, tmp_path, monkeypatch):
    monkeypatch.setattr(load, "STREAM_BYTES", 1)  # every file counts as large
    model = onnx.load(str(source))
    assert load.load_model(source).SerializeToString() == model.SerializeToString()
    streamed = load.save_model(constants_to_initializers(model), tmp_path / "streamed.onnx")
    assert load.load_model(streamed).SerializeToString() == onnx.load(str(streamed)).SerializeToString()


def test_external_data_and_bad_files_read_piece_by_piece(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "STREAM_BYTES", 1)
    model = constants_to_initializers(onnx.load(str(CLASSIFIER)))
    path = load.save_model(model, tmp_path / "external.onnx", external_data=True)
    assert load.load_model(path).SerializeToString() == onnx.load(str(path)).SerializeToString()
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x3a\xff\xff\x03not a model")  # a graph field longer than the file
    with pytest.raises(load.ModelError, match="not an ONNX model"):
        load.load_model(junk)
