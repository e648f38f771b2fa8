"""The switchboard: one switched model gives every fp16 candidate's emulated values, bit for bit."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Dict

import numpy as np
import onnx
import pytest

from examples.planted import one_sensitive, rmsnorm_decoder, two_branches
from runner.backends.fp16_emulation import EmulationBackend
from runner.lowp.convert import Converter, float_nodes, prepare
from runner.lowp.fp16_switchboard import build_switchboard
from runner.lowp.precisions import BFLOAT16, FLOAT16
from runner.lowp.switchboard import LazySwitchboard
from tests.helpers.models import need

SHARED = Path(__file__).resolve().parents[4] / "shared" / "models"


def _agree(model: onnx.ModelProto, feeds: Dict[str, np.ndarray], trials: int, low=FLOAT16) -> int:
    """Run random kept sets (and none, and all) both ways; assert equal bits; the number of Inf/NaN
    outputs seen (the cases where rounding showed)."""
    prepared = prepare(model, low)
    converter = Converter(prepared, low)
    board = build_switchboard(prepared, converter, "test")
    assert board is not None
    layers = float_nodes(prepared)
    assert set(board.switches) <= set(layers) and board.switches
    emulation = EmulationBackend(graph_optimization_level="disable")
    rng = random.Random(0)
    sets = [frozenset(), frozenset(layers)] + [
        frozenset(rng.sample(layers, rng.randrange(1, len(layers)))) for _ in range(trials)
    ]
    nonfinite = 0
    for kept in sets:
        built = converter.convert([prepared.graph.node[i].name for i in kept])
        want = emulation.run(built, feeds)
        got = emulation.run_as_rounded(board.model, {**feeds, **board.feeds(kept)}, key="board")
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype
            assert np.array_equal(got[name], want[name], equal_nan=True), f"{name} differs keeping {len(kept)} nodes"
            nonfinite += int(not np.isfinite(want[name]).all())
    return nonfinite


def test_planted_overflows_give_the_built_candidates_bits():
    """Weights past fp16's range (clipped to 65504 by the converter, not rounded to Inf) times inputs past 1."""
    feeds = {"x": np.linspace(0.5, 3.0, 8, dtype=np.float32).reshape(1, 8)}
    assert _agree(one_sensitive()[0], feeds, 6) > 0, "some candidate overflows, and the switched run shows it"
    assert _agree(two_branches()[0], feeds, 6) > 0


def test_an_rmsnorm_decoder_gives_the_built_candidates_bits():
    model, _, ids = rmsnorm_decoder(layers=2)
    _agree(model, {"ids": ids}, 6)


def test_a_decoder_exported_with_its_norms_casts_gives_the_built_candidates_bits():
    """Qwen2's RMSNorm as torch exports it casts to fp32 and back (``attention_decoder(casts=True)``): Casts that
    round only where a kept node makes their input; random kept sets of 2 layers give the built bits."""
    from examples.planted import attention_decoder

    model, _, ids = attention_decoder(layers=2, dim=32, heads=4, vocab=64, casts=True)
    assert sum(n.op_type == "Cast" for n in model.graph.node) == 10  # 2 a norm, 2 norms a layer, the final norm
    _agree(model, {"ids": ids}, 8)
    _agree(model, {"ids": ids}, 4, BFLOAT16)


@pytest.mark.slow  # 1.2-2.3 s: the detector built and switched, over the 1.5 s of an unmarked test under load
def test_the_detector_gives_the_built_candidates_bits():
    """Conv, Resize (its scales stay fp32), BatchNormalization, HardSigmoid: 330 switched nodes."""
    model = onnx.load(str(need(SHARED / "ch_PP-OCRv4_det_infer.onnx")))
    pixels = (np.random.default_rng(0).random((1, 3, 32, 32)) * 255).astype(np.float32)
    _agree(model, {"x": pixels}, 2)


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny", "vit_tiny"])
def test_transformer_exports_give_the_built_candidates_bits(name):
    """LayerNormalization or its pieces, Softmax, Gather, shape arithmetic left unswitched."""
    model = onnx.load(str(need(SHARED / "zoo" / f"{name}.onnx")))
    feeds = dict(np.load(SHARED / "zoo" / f"{name}.npz"))
    inputs = {i.name for i in model.graph.input}
    _agree(model, {k: v for k, v in feeds.items() if k in inputs}, 3)


def test_bf16_candidates_give_the_built_candidates_bits():
    """bfloat16: the same rounding through Casts to bf16, weights as the converter re-makes them."""
    feeds = {"x": np.linspace(0.5, 3.0, 8, dtype=np.float32).reshape(1, 8)}
    _agree(one_sensitive()[0], feeds, 4, BFLOAT16)
    model, _, ids = rmsnorm_decoder(layers=2)
    _agree(model, {"ids": ids}, 4, BFLOAT16)
    bert = onnx.load(str(need(SHARED / "zoo" / "bert_tiny.onnx")))
    inputs = {i.name for i in bert.graph.input}
    _agree(bert, {k: v for k, v in np.load(SHARED / "zoo" / "bert_tiny.npz").items() if k in inputs}, 2, BFLOAT16)


def test_no_switchboard_for_bodies():
    vad = prepare(onnx.load(str(need(SHARED / "silero_vad.onnx"))), FLOAT16)
    assert any(n.op_type == "If" for n in vad.graph.node)
    assert build_switchboard(vad, Converter(vad, FLOAT16), "k") is None


@pytest.mark.usefixtures("small_maps")
def test_a_large_models_switchboard_maps_its_weights_and_gives_the_built_candidates_bits():
    """A model past ``MAP_BYTES``: the switched model holds no weight, its fp32 weights and their fp16 forms point
    into the weight file (each fp16 form widened in the branch that reads it, as the emulated candidate widens
    it), and every candidate's switched run gives its emulated conversion's bits."""
    from runner.graph import weight_file as wf
    from runner.graph.stubs import nbytes

    model, _, ids = rmsnorm_decoder(layers=2, dim=64, vocab=128)
    assert wf.maps(wf.weight_bytes(model))
    prepared = prepare(model, FLOAT16)
    board = build_switchboard(prepared, Converter(prepared, FLOAT16), "large")
    assert board is not None and wf.is_mapped(board.model)
    assert all(nbytes(i) < 1024 for i in board.model.graph.initializer), "no weight held in the switched model"
    _agree(model, {"ids": ids}, 6)


def test_a_switchboard_pickles_as_none_and_builds_once():
    model, _, _ = one_sensitive()
    prepared = prepare(model, FLOAT16)
    lazy = LazySwitchboard(lambda: build_switchboard(prepared, Converter(prepared, FLOAT16), "k"))
    first = lazy.get()
    assert first is not None and lazy.get() is first
    assert pickle.loads(pickle.dumps(lazy)).get() is None


def test_a_switchboard_that_cannot_be_built_is_none(caplog):
    """A converter that fails on the model: no switchboard, a log line, and the run goes on (each
    candidate's own build then says what fails)."""
    import logging

    from runner.errors import ModelError

    class Failing(Converter):
        def convert(self, keep):
            raise ModelError("planted")

    model, _, _ = one_sensitive()
    prepared = prepare(model, FLOAT16)
    with caplog.at_level(logging.INFO):
        assert LazySwitchboard(lambda: build_switchboard(prepared, Failing(prepared, FLOAT16), "k")).get() is None
    assert "No switched model (ModelError: planted)" in caplog.text


def test_a_model_the_conversion_leaves_as_it_is_has_no_switchboard():
    """Only integer arithmetic: no node to switch."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "a"], ["b"], name="add")],
        "ints",
        [helper.make_tensor_value_info("a", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("b", TensorProto.INT64, [2])],
    )
    model = prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), FLOAT16)
    assert build_switchboard(model, Converter(model, FLOAT16), "k") is None


def test_native_switchboards_run_each_converted_node_as_the_conversion_writes_it():
    """The native switchboard (``native=True``, for a device's provider) holds, beside each switched node, the node
    as the conversion writes it reading its low-precision inputs, and a ``Where`` on the switch per output (no
    ``If``: the CUDA provider gives each body a cuBLAS handle); run on ONNX Runtime's CPU
    provider it gives the built candidates' bits where that provider has the fp16 kernels (or the node is
    alone): a planted overflow and an RMSNorm decoder (the CPU provider computes longer runs of fp16 nodes it
    has no kernels for in fp32, so the transformer exports differ there: the checker's cross-checks see it)."""
    from runner.backends.onnxruntime import OnnxRuntimeBackend

    feeds = {"x": np.linspace(0.5, 3.0, 8, dtype=np.float32).reshape(1, 8)}
    model, _, ids = rmsnorm_decoder(layers=2)
    for source, inputs in ((one_sensitive()[0], feeds), (model, {"ids": ids})):
        prepared = prepare(source)
        converter = Converter(prepared)
        board = build_switchboard(prepared, converter, "native", native=True)
        assert board is not None and board.switches
        typed = {n.name: n for n in converter.convert([]).graph.node}
        ops = [n.op_type for n in board.model.graph.node]
        assert "If" not in ops and ops.count("Where") >= len(board.switches)
        forms = [n for n in board.model.graph.node if n.name.endswith("__low")]
        assert len(forms) == len(board.switches)
        for form in forms:
            twin = typed[form.name[: -len("__low")]]
            assert form.op_type == twin.op_type and list(form.attribute) == list(twin.attribute)
        ort_backend = OnnxRuntimeBackend(graph_optimization_level="disable")
        layers = float_nodes(prepared)
        rng = random.Random(1)
        for kept in [frozenset(), frozenset(layers)] + [frozenset(rng.sample(layers, 2)) for _ in range(4)]:
            built = converter.convert([prepared.graph.node[i].name for i in kept])
            want = ort_backend.run(built, inputs)
            got = ort_backend.run(board.model, {**inputs, **board.feeds(kept)}, key="native")
            for name in want:
                assert np.array_equal(got[name], want[name], equal_nan=True), f"{name} keeping {len(kept)}"


@pytest.mark.parametrize("native", [False, True])
def test_an_exporters_cast_to_fp32_rounds_where_a_kept_node_makes_its_input(native):
    """A Cast to fp32 of an fp32 tensor (torch's ``.to(torch.float32)``, as in Qwen2's RMSNorm): the conversion with
    no node kept drops it, but a candidate keeping the node before it writes it as a Cast to fp16, which rounds
    what a kept node after it reads. Both switched models round there too: every kept set of the three nodes
    gives the built candidate's bits (on an H200 the native switched model differed from 4 of 6 candidates of a
    Qwen2-0.5B export before)."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from examples.planted import f32, make_model

    nodes = [
        helper.make_node("Mul", ["x", "s"], ["a"], name="A"),
        helper.make_node("Cast", ["a"], ["c"], to=TensorProto.FLOAT, name="X"),
        helper.make_node("Mul", ["c", "a"], ["y"], name="C"),
    ]
    scale = numpy_helper.from_array(np.array(1.0001, np.float32), "s")
    model = prepare(make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], [scale]))
    converter = Converter(model)
    board = build_switchboard(model, converter, "k", native=native)
    assert board is not None and sorted(board.switches) == [0, 1, 2]
    feeds = {"x": np.linspace(1.0001, 3.0003, 8, dtype=np.float32).reshape(1, 8)}
    emulation = EmulationBackend(graph_optimization_level="disable")
    for bits in range(8):
        kept = frozenset(i for i in range(3) if bits >> i & 1)
        built = converter.convert([model.graph.node[i].name for i in kept])
        switched = {**feeds, **board.feeds(kept)}
        if native:  # numpy's fp16 arithmetic, node by node (ONNX Runtime's CPU provider computes runs in fp32)
            want, got = (
                ReferenceEvaluator(built).run(None, feeds)[0],
                ReferenceEvaluator(board.model).run(None, switched)[0],
            )
        else:
            want, got = emulation.run(built, feeds)["y"], emulation.run(board.model, switched, key="k")["y"]
        assert np.array_equal(want, got), f"keeping {sorted(kept)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2_tiny", "bert_tiny", "vit_tiny"])
def test_the_native_switchboard_of_a_transformer_export_is_its_candidates_node_for_node(name):
    """The native switched model computes what each built candidate computes, node by node in fp16, on any
    arithmetic that computes each node as written: onnx's reference evaluator (numpy, node by node) gives the
    same bits for random kept sets of GPT-2, BERT and ViT exports (an H200's CUDA provider did too: 0 of 6 differ
    on each, ``benchmarks/README.md``)."""
    from onnx.reference import ReferenceEvaluator

    model = prepare(onnx.load(str(need(SHARED / "zoo" / f"{name}.onnx"))))
    feeds = dict(np.load(SHARED / "zoo" / f"{name}.npz"))
    converter = Converter(model)
    board = build_switchboard(model, converter, "native", native=True)
    assert board is not None
    switched = ReferenceEvaluator(board.model)
    layers, rng = float_nodes(model), random.Random(0)
    for share in (0.1, 0.3, 0.6):
        kept = frozenset(rng.sample(layers, int(len(layers) * share)))
        want = ReferenceEvaluator(converter.convert([model.graph.node[i].name for i in kept])).run(None, feeds)
        got = switched.run(None, {**feeds, **board.feeds(kept)})
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(want, got)), f"keeping {len(kept)}"
