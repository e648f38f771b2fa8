"""The weight file: sessions of large models map their weights (issue 34's memory target), give the
same outputs as sessions that copy them, write each distinct tensor once, and fall back to copying
when the file cannot be written. The thresholds are lowered so that small models count as large."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner.graph import weight_file as wf
from runner.graph.load import save_model
from runner.graph.sessions import loads_on_cpu, session_for
from runner.graph.stubs import nbytes
from runner.lowp.convert import Converter, convert_except
from runner.lowp.emulate import emulate_low_precision
from tests.helpers.graphs import DECODER_CHECK, rmsnorm_decoder_files
from tests.helpers.inprocess import run_in_process

pytestmark = pytest.mark.usefixtures("small_maps")


def _mlp(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((128, 16)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _copied_session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _file_size() -> int:
    directory = wf.weight_file().directory
    assert directory is not None
    return (directory / wf.weight_file().name).stat().st_size


def test_a_mapped_session_gives_the_copied_sessions_outputs_and_writes_each_tensor_once():
    model = _mlp()
    x = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    got = session_for(model).run(None, x)[0]
    np.testing.assert_array_equal(got, _copied_session(model).run(None, x)[0])
    size = _file_size()
    assert size >= (64 * 128 + 128 * 16) * 4
    session_for(model).run(None, x)  # the same weights: nothing more is written
    assert _file_size() == size
    leftovers = sorted(p.name for p in wf.weight_file().directory.iterdir())
    assert leftovers == [wf.weight_file().name]  # each session's model file is removed once it is loaded


def test_a_mapped_model_is_small_and_gets_its_values_back(tmp_path):
    model = _mlp()
    mapped = wf.weight_file().mapped(model)
    assert mapped is not None and wf.is_mapped(mapped)
    assert mapped.ByteSize() < 2048
    assert wf.weight_bytes(mapped) == wf.weight_bytes(model)
    back = wf.weight_file().with_values(mapped)
    assert not wf.is_mapped(back)
    assert [t.raw_data for t in back.graph.initializer] == [t.raw_data for t in model.graph.initializer]
    written = onnx.load(str(save_model(mapped, tmp_path / "written.onnx")))  # a file never points into it
    assert written.SerializeToString() == back.SerializeToString()


def test_a_mapped_model_is_written_one_tensor_at_a_time_as_its_filled_copy(tmp_path, monkeypatch):
    """A mapped candidate past ``STREAM_BYTES`` (a large model's iteration artifact) is written without a
    whole copy of it holding its values: each tensor gets its values from the weight file as it is written,
    and the file is byte for byte the one its filled copy makes."""
    from runner.graph import load

    monkeypatch.setattr(load, "STREAM_BYTES", 1024)
    candidate = Converter(_mlp()).convert(["mm1"])
    assert wf.is_mapped(candidate) and wf.stored_bytes(candidate) >= 1024
    filled = wf.weight_file().with_values(candidate)

    def no_whole_copy(self, model):
        raise AssertionError("a whole copy holding the values was made")

    with monkeypatch.context() as patch:
        patch.setattr(wf.WeightFile, "with_values", no_whole_copy)
        mapped_file = save_model(candidate, tmp_path / "mapped.onnx")
    filled_file = save_model(filled, tmp_path / "filled.onnx")
    assert mapped_file.read_bytes() == filled_file.read_bytes()
    assert not wf.is_mapped(onnx.load(str(mapped_file)))


def test_a_mapped_model_with_external_data_is_written_file_to_file_with_its_filled_copys_values(tmp_path, monkeypatch):
    """A mapped answer written with external data (a model over 2 GB, or ``external_data=true``) copies each
    pointed tensor from the weight file into its data file without a whole copy holding the values; it loads with
    the values its filled copy has, page-aligned, and runs to the same outputs."""
    candidate = Converter(_mlp()).convert(["mm1"])
    filled = wf.weight_file().with_values(candidate)

    def no_whole_copy(self, model):
        raise AssertionError("a whole copy holding the values was made")

    with monkeypatch.context() as patch:
        patch.setattr(wf.WeightFile, "with_values", no_whole_copy)
        path = save_model(candidate, tmp_path / "answer.onnx", external_data=True, threshold=1024)
    stored = onnx.load(str(path), load_external_data=False)
    offsets = [int(e.value) for t in stored.graph.initializer for e in t.external_data if e.key == "offset"]
    assert offsets and all(o % 4096 == 0 for o in offsets)
    back = onnx.load(str(path))
    assert {t.name: numpy_helper.to_array(t).tobytes() for t in back.graph.initializer} == {
        t.name: numpy_helper.to_array(t).tobytes() for t in filled.graph.initializer
    }
    x = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_array_equal(got, _copied_session(filled).run(None, x)[0])


def test_marked_copies_of_a_large_model_map_its_weights():
    """Layerwise and the golden run mark tensors on a copy of the model: a large model's copy points
    into the weight file (no copy of its weights) and every tensor's value is as a copied session's."""
    from runner.graph.activations import marked, run_tensors

    model = _mlp()
    copy = marked(model, ["h", "y"])
    assert wf.is_mapped(copy) and copy.ByteSize() < 2048
    x = {"x": np.ones((4, 64), np.float32)}
    got = run_tensors(model, x, ["h", "y"])
    want = _copied_session(model).run(["y"], x)[0]
    np.testing.assert_array_equal(got["y"], want)
    assert got["h"].shape == (4, 128)


def test_the_emulation_widens_each_fp16_weight_once_and_runs_as_before(monkeypatch):
    model = _mlp()
    half = convert_except(model, [])
    mapped, _, _, _ = emulate_low_precision(half)
    assert wf.is_mapped(mapped)
    size = _file_size()
    emulate_low_precision(convert_except(model, ["relu"]))  # the same fp16 weights
    assert _file_size() == size
    monkeypatch.setattr(wf, "MAP_BYTES", 2**40)  # the same rewrite, with its weights in the model
    filled, _, _, _ = emulate_low_precision(wf.weight_file().with_values(half))
    assert not wf.is_mapped(filled)
    x = {"x": np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)}
    np.testing.assert_array_equal(session_for(mapped).run(None, x)[0], _copied_session(filled).run(None, x)[0])


def test_a_large_models_fp16_candidates_point_into_the_file_and_run_as_filled_ones(monkeypatch):
    """A candidate of a large model holds no weight: each weight's fp16 form, and the fp32 one a kept node
    reads, is written once per run and pointed at; it runs as the candidate with its values does, and
    travels to another process with them (``portable``)."""
    model = _mlp()
    converter = Converter(model)
    first = converter.convert(["mm1"])
    assert wf.is_mapped(first) and all(nbytes(i) < 256 for i in first.graph.initializer)
    converter.convert([])  # w1's fp16 form: written now
    size = _file_size()
    again = converter.convert(["mm1"])
    converter.convert([])
    assert _file_size() == size, "each form is written once"
    filled = wf.weight_file().portable(again)
    assert not wf.is_mapped(filled) and wf.weight_bytes(filled) > 0
    x = {"x": np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)}
    got = session_for(emulate_low_precision(first)[0]).run(None, x)[0]
    monkeypatch.setattr(wf, "MAP_BYTES", 2**40)  # a model under the threshold: its candidates hold their values
    np.testing.assert_array_equal(got, _copied_session(emulate_low_precision(filled)[0]).run(None, x)[0])
    assert not wf.is_mapped(Converter(model).convert(["mm1"]))


def test_a_weight_file_that_cannot_be_written_leaves_sessions_copying(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr("tempfile.tempdir", str(blocker))  # mkdtemp fails: a real OSError
    model = _mlp()
    x = {"x": np.ones((4, 64), np.float32)}
    assert wf.weight_file().mapped(model) is None
    np.testing.assert_array_equal(session_for(model).run(None, x)[0], _copied_session(model).run(None, x)[0])
    assert "set TMPDIR" in caplog.text
    assert loads_on_cpu(model) is None


def test_precision_keeps_the_same_nodes_with_mapped_sessions(tmp_path):
    """The RMSNorm decoder of issue 34 with every session mapped: the four needed nodes, verified."""
    needed, model, files = rmsnorm_decoder_files(tmp_path, layers=2)
    r = run_in_process(tmp_path, "run", "mode=precision", "marker=minimal", *files, *DECODER_CHECK)
    assert r.returncode == 0, r.stdout[-2000:]
    assert sorted(n["name"] for n in r.summary["kept_nodes"]) == sorted(needed)
    assert r.summary["answer_verified"]["passed"]
    assert _file_size() > wf.weight_bytes(model)  # the weights and their widened fp16 forms were mapped


def test_a_mapped_fp16_model_is_emulated_from_the_file(monkeypatch):
    """Layerwise marks tensors on a mapped copy of the fp16 target: its fp16 weights stay in the file,
    read through Casts, and the emulated run matches the one with its weights in the model."""
    half = convert_except(_mlp(), [])
    mapped = wf.weight_file().mapped(half)
    assert mapped is not None and wf.is_mapped(mapped)
    from_file, _, _, _ = emulate_low_precision(mapped)
    assert any(n.op_type == "Cast" and n.input[0].endswith("__emu_stored") for n in from_file.graph.node)
    monkeypatch.setattr(wf, "MAP_BYTES", 2**40)
    in_model, _, _, _ = emulate_low_precision(wf.weight_file().with_values(half))
    x = {"x": np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)}
    np.testing.assert_array_equal(session_for(from_file).run(None, x)[0], _copied_session(in_model).run(None, x)[0])


def test_a_mapped_model_never_reads_another_processes_weight_file(monkeypatch):
    """A mapped model that reached another process (a pickled cache) fails there; it never reads that
    process's own file. The emulation backend is pickled without its rewritten (mapped) models, so a
    worker's copy runs a model it was sent before as it would run any."""
    import pickle

    from runner.backends.fp16_emulation import EmulationBackend
    from runner.errors import ModelError

    model, x = _mlp(), {"x": np.ones((4, 64), np.float32)}
    half = convert_except(model, [])
    mapped = wf.weight_file().mapped(model)
    backend = EmulationBackend()
    here = backend.run(half, x, key="k")["y"]
    sent, shipped = pickle.dumps(backend), wf.weight_file().portable(half)  # as a candidate is shipped
    from runner.backends.onnxruntime import OnnxRuntimeBackend
    from runner.executors.spread import RunHere
    from runner.layerwise.alone import run_alone

    assert run_alone(OnnxRuntimeBackend(), (mapped, x, None))[1] == ""  # in its own process it runs
    other = wf.WeightFile()  # the worker's own weight file, holding other weights
    monkeypatch.setattr(wf, "_shared", other)
    with pytest.raises(RunHere, match="in the runner's weight file"):  # a worker hands it back to its lane
        run_alone(OnnxRuntimeBackend(), (mapped, x, None))
    session_for(_mlp(seed=1))
    with pytest.raises(ModelError):
        session_for(mapped)
    with pytest.raises(ModelError, match="another process's weight file"):
        other.with_values(mapped)
    assert not wf.is_mapped(shipped)
    np.testing.assert_array_equal(pickle.loads(sent).run(shipped, x, key="k")["y"], here)


def test_a_tensor_longer_than_one_read_is_read_whole(tmp_path, monkeypatch):
    """Issue 75: one ``os.pread`` returns at most 0x7ffff000 bytes on Linux, and a 7B decoder's 2.18 GB embedding
    came back short ("cannot reshape array of size 536869888 into shape (152064,3584)"). Reads of more than
    ``READ_CHUNK`` bytes go in pieces (here the chunk is 1,000 bytes)."""
    import os

    data = np.arange(10_000, dtype=np.uint8).tobytes()
    path = tmp_path / "weights.bin"
    path.write_bytes(b"head" + data)
    monkeypatch.setattr(wf, "READ_CHUNK", 1000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert wf.read_exactly(fd, 4, len(data)) == data
        assert wf.read_exactly(fd, 4, 10) == data[:10]
        with pytest.raises(OSError, match="short"):
            wf.read_exactly(fd, 4, len(data) + 5_000)
    finally:
        os.close(fd)


def test_a_tensor_pointed_again_is_not_read_again_and_equal_tensors_share_one_copy(monkeypatch):
    """A large model's sessions point the same weights into the file each time (the reference, the spread, the
    ranking): a tensor seen before is found by identity without reading or hashing its bytes (a 2.8 GB decoder
    hashed 14 s of weights per run), and an equal tensor of another object still shares its copy."""
    from runner.graph import stubs

    reads = []
    real = stubs.raw_bytes
    monkeypatch.setattr(wf, "raw_bytes", lambda t: reads.append(t.name) or real(t))
    model = _mlp()
    file = wf.weight_file()
    first, again = file.mapped(model), file.mapped(model)
    assert sorted(reads) == ["w1", "w2"], reads  # the second mapping read nothing
    assert [i.external_data for i in first.graph.initializer] == [i.external_data for i in again.graph.initializer]
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    twin = file.mapped(copy)
    assert [i.external_data for i in twin.graph.initializer] == [i.external_data for i in first.graph.initializer]


def test_fp16_weights_are_clipped_bit_for_bit_as_onnx_runtimes_converter_clips_them(monkeypatch):
    """``float16_bytes`` rounds with ONNX Runtime's Cast and mends what rounding alone gives otherwise; its bytes
    are those of ``convert_np_to_float16`` on zeros, infinities, NaN, values past fp16's range and under its
    smallest subnormal, of both signs, across chunk boundaries."""
    from onnxruntime.transformers.float16 import convert_np_to_float16

    from runner.graph import stubs

    monkeypatch.setattr(stubs, "FP16_CHUNK", 1000)
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(20_000) * 10.0 ** rng.integers(-12, 8, 20_000)).astype(np.float32)
    edges = [0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, -7e4, 5.96e-8, -1e-9, 2**-25, -(2**-25), 65519.99, -3e-8]
    values[: len(edges)] = edges
    values[995:1005] = edges[:10]  # across a chunk's end
    want = convert_np_to_float16(values, 5.96e-08, 65504.0).tobytes()
    for tensor in (numpy_helper.from_array(values), numpy_helper.from_array(values.astype(np.float64))):
        assert stubs.float16_bytes(tensor, 5.96e-08, 65504.0) == want
