"""mode=layerwise: planted introduced error (overflow, a perturbed weight, precision lost only in bf16),
the real models, every backend that runs here, chunked values, and the report files."""

from __future__ import annotations

import csv
import importlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner.backends.base import make_backend
from runner.checkers.compare.tolerance import Tolerances
from runner.graph.isolate import REF_SUFFIX, isolated_model
from runner.layerwise.compute import LayerwiseComparison
from runner.layerwise.tensors import tensor_types, weight_peaks
from runner.lowp.convert import name_nodes, to_low_precision
from tests.helpers.models import CLASSIFIER, DETECTOR, VAD_IF, chain_model, f32, make_model, need, overflow_model


def _mix_model() -> onnx.ModelProto:
    """y = x * 1 + x * (-0.999) "mix" (cancellation): bf16 rounds -0.999 to -1 (y loses everything), fp16 keeps
    it to 5e-4 (y to 2%), so the node introduces a large error only in bf16."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1], [1.0, -0.999])
    nodes = [
        helper.make_node("Relu", ["x"], ["pos"], name="pre"),
        helper.make_node("Concat", ["pos", "pos"], ["pair"], name="dup", axis=1),
        helper.make_node("MatMul", ["pair", "w"], ["mixed"], name="mix"),
        helper.make_node("Relu", ["mixed"], ["y"], name="post"),
    ]
    return make_model(nodes, [f32("x", [4, 1])], [f32("y", [4, 1])], [w])


def _layerwise(run, model_path, *extra, plot=False):
    r = run("mode=layerwise", f"model={model_path}", f"layerwise.plot={str(plot).lower()}", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_overflow_is_introduced_by_the_node_that_overflows(run, tmp_path):
    path = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), path)
    r = _layerwise(
        run,
        path,
        "checker.backend=fp16_emulation",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
        "val_range=[250,255]",
        plot=True,
    )
    s = r.summary
    assert s["first_divergence"]["node"] == "scale" and s["first_divergence"]["op"] == "Mul"
    top = s["top_introduced"][0]
    assert top["node"] == "scale" and top["introduced"]["new_nonfinite"] == 4 and not top["in_range"]
    assert [t["node"] for t in s["top_introduced"][1:]] and all(
        t["introduced"]["new_nonfinite"] == 0 for t in s["top_introduced"][1:]
    ), "nodes after the overflow, fed exact inputs, introduce no NaN/Inf of their own"
    with open(r.run_dir / "layerwise.csv") as f:
        accumulated = {row["node"]: row for row in csv.DictReader(f)}
    assert set(accumulated) == {"pre", "scale", "shrink", "act"}
    assert int(accumulated["act"]["acc_inf"]) == 4 and accumulated["act"]["intro_inf"] == "0"
    assert s["nodes"] == 4 and s["tensors_compared"] == 4
    assert (r.run_dir / "layerwise.png").stat().st_size > 10_000
    assert "first divergence: scale (Mul)" in r.stdout


@pytest.mark.parametrize("backend", ["onnxruntime", "onnx_reference", "fp16_emulation", "bf16_emulation"])
def test_a_perturbed_weight_is_found_against_the_original(run, tmp_path, backend):
    """The chain with one Add's constant changed, compared with the original through reference_model=, on every
    backend that runs here (the emulations run it converted): that Add is the first divergence and first in
    top_introduced."""
    original = chain_model(8)
    edited = onnx.ModelProto()
    edited.CopyFrom(original)
    const = next(n for n in edited.graph.node if n.op_type == "Constant")
    # n3 gets its own constant, 1.5x the shared one
    new = helper.make_node(
        "Constant", [], ["c15"], name="const15", value=helper.make_tensor("v", TensorProto.FLOAT, [1, 4], [1.5] * 4)
    )
    edited.graph.node.insert(1, new)
    n3 = next(n for n in edited.graph.node if n.name == "n3")
    n3.input[1] = "c15"
    del const
    ref_path, path = tmp_path / "original.onnx", tmp_path / "edited.onnx"
    onnx.save(original, ref_path)
    onnx.save(edited, path)
    r = _layerwise(
        run,
        path,
        f"reference_model={ref_path}",
        f"checker.backend={backend}",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.02",
        "val_range=[1,2]",
    )
    s = r.summary
    assert s["first_divergence"]["node"] == "n3", s["first_divergence"]
    assert s["top_introduced"][0]["node"] == "n3"
    assert s["top_introduced"][0]["introduced"]["rel_l2"] > 0.05


def test_a_conv_weight_scaled_by_1_5_on_the_classifier(run, tmp_path):
    """The issue's acceptance: one Conv weight of the real classifier scaled by 1.5, compared with the original."""
    model = onnx.load(str(need(CLASSIFIER)))
    uses: dict = {}
    for n in model.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    convs = [n for n in model.graph.node if n.op_type == "Conv" and uses[n.input[1]] == 1]
    target = convs[len(convs) // 2]
    const = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == target.input[1])
    value = next(a for a in const.attribute if a.name == "value")  # this model's weights are Constant nodes
    value.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(value.t) * 1.5, value.t.name))
    path = tmp_path / "scaled.onnx"
    onnx.save(model, path)
    r = _layerwise(
        run,
        path,
        f"reference_model={CLASSIFIER}",
        "model_input_shapes={x:[1,3,48,192]}",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.01",
    )
    s = r.summary
    assert s["first_divergence"]["node"] == target.name
    assert s["top_introduced"][0]["node"] == target.name
    assert s["nodes"] == len([n for n in model.graph.node if n.op_type != "Constant"])


def test_precision_lost_only_in_bf16(run, tmp_path):
    path = tmp_path / "mix.onnx"
    onnx.save(_mix_model(), path)
    args = ["checker.check_error_stat=rel_l2", "checker.rtol=0.05", "val_range=[1,2]"]
    bf16 = _layerwise(run, path, "checker.backend=bf16_emulation", *args).summary
    assert bf16["first_divergence"]["node"] == "mix" and bf16["top_introduced"][0]["node"] == "mix"
    assert bf16["top_introduced"][0]["introduced"]["rel_l2"] > 0.5
    fp16 = _layerwise(run, path, "checker.backend=fp16_emulation", *args).summary
    assert fp16["first_divergence"] is None
    assert max(t["introduced"]["rel_l2"] for t in fp16["top_introduced"]) < 0.05


@pytest.mark.slow
def test_the_detector_on_pixels_names_its_batchnorm(run):
    """The issue's acceptance: the fp32 detector fed 0-255 under fp16 emulation."""
    r = _layerwise(
        run,
        need(DETECTOR),
        "checker.backend=fp16_emulation",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.05",
        "val_range=[0,255]",
        "model_input_shapes={x:[1,3,64,64]}",
    )
    s = r.summary
    top = s["top_introduced"][0]
    assert top["node"] == "p2o.BatchNormalization.1" and not top["in_range"] and top["weights"] > 65504
    assert s["first_divergence"]["index"] <= top["index"]
    assert s["nodes"] == 330


@pytest.mark.slow  # 1.0-2.0 s on this project's 2-core machine: at the 1.5 s limit of an unmarked test
def test_if_nodes_run_alone_in_a_model_of_their_own(run):
    """The voice-activity model with If subgraphs: the If reads outer-scope tensors and still gets its introduced
    error."""
    r = _layerwise(
        run,
        need(VAD_IF),
        "checker.backend=fp16_emulation",
        "model_input_shapes={input:[1,512],state:[2,1,128]}",
        "val_range={sr:[16000,16000],default:[-1,1]}",
    )
    rows = {t["node"]: t for t in r.summary["top_introduced"]}
    assert "If_0" in rows and rows["If_0"]["introduced"]["rel_l2"] < 0.01


def test_values_in_chunks_give_the_same_rows():
    """A memory budget below the model's values compares chunk by chunk, with the same result."""
    model = name_nodes(chain_model(12, shape=(1, 64)))
    target = to_low_precision(model)
    feeds = [{"x": np.linspace(-2, 2, 64, dtype=np.float32)[None]}]
    reference = make_backend("onnxruntime", graph_optimization_level="disable")
    sizes = {o: 256 for n in model.graph.node for o in n.output}

    def rows(budget):
        lw = LayerwiseComparison(
            model,
            target,
            {n.name for n in model.graph.node if n.op_type != "Constant"},
            weight_peaks(model),
            lambda m, f, key=None: reference.run(m, f, key=key),
            make_backend("fp16_emulation"),
            Tolerances(stat="rel_l2", rtol=0.05),
            "float16",
            budget,
            sizes,
        )
        return len(lw.chunks), lw.run(feeds)

    (one, whole), (many, chunked) = rows(None), rows(3000)
    assert one == 1 and many >= 4
    assert [(r.node, r.accumulated, r.introduced) for r in whole] == [
        (r.node, r.accumulated, r.introduced) for r in chunked
    ]


def test_a_qdq_targets_chunks_count_the_values_its_q_dq_nodes_carry():
    """Sizes are known for the reference's tensors; a QDQ target's Q/DQ outputs are as large as the float
    tensor they carry. Counted as nothing, a chain of quantized Convs fit one chunk of a budget it passes."""
    from runner.lowp.calibration import calibrate
    from runner.lowp.quant_options import QuantOptions
    from runner.lowp.quantize import make_quantizer, prepare_int8
    from tests.helpers.int8 import conv_outlier_model, samples

    model = prepare_int8(conv_outlier_model())
    feeds = list(samples())
    target = make_quantizer(model, calibrate(model, feeds, QuantOptions()), QuantOptions()).convert([])
    float_tensors = [o for n in model.graph.node for o in n.output] + [i.name for i in model.graph.input]
    sizes = {t: 1000 for t in float_tensors}
    float_cost = sum(4 * 1000 * len(n.output) + 1000 * len(n.input) for n in model.graph.node)
    lw = LayerwiseComparison(
        model,
        target,
        None,
        weight_peaks(model),
        make_backend("onnxruntime").run,
        make_backend("onnxruntime"),
        Tolerances(stat="rel_l2"),
        "int8",
        float_cost,
        sizes,
    )
    assert len(lw.chunks) >= 2, "the Q/DQ outputs' values count as the float tensors they carry"


def test_the_comparisons_sessions_keep_no_cpu_arena():
    """A comparison runs models with every tensor marked: a CPU arena would keep all the values of a run
    after it (``layerwise.max_memory_mb=64`` peaked at 477 MB). The checker's own sessions keep theirs."""
    from runner.checkers.compare import CompareChecker
    from runner.graph.sessions import session_for

    model = chain_model(3)
    assert session_for(model).get_session_options().enable_cpu_mem_arena
    assert not session_for(model, cpu_arena=False).get_session_options().enable_cpu_mem_arena
    checker = CompareChecker.of(backend="fp16_emulation", graph_optimization_level="basic")
    comparison = checker.comparison().backend()
    try:
        assert comparison is not checker.backend and comparison.ort.level == checker.backend.ort.level
        assert comparison.ort.cpu_arena is False and checker.backend.ort.cpu_arena is True
    finally:
        comparison.close()


def test_isolated_model_feeds_each_node_its_own_inputs():
    model = overflow_model()
    iso = isolated_model(model, list(model.graph.node), tensor_types(model))
    assert sorted(i.name for i in iso.graph.input) == sorted(f"{t}{REF_SUFFIX}" for t in ["x", "pos", "big", "small"])
    assert [o.name for o in iso.graph.output] == ["pos", "big", "small", "y"]
    got = make_backend("onnxruntime").run(
        iso,
        {
            f"{t}{REF_SUFFIX}": np.full((1, 4), v, np.float32)
            for t, v in [("x", -1), ("pos", 2), ("big", 3), ("small", -4)]
        },
    )
    assert got["pos"][0, 0] == 0 and got["big"][0, 0] == 600 and got["small"][0, 0] == pytest.approx(0.003)
    assert got["y"][0, 0] == 0


def test_several_samples_keep_each_nodes_worst(run, tmp_path, on_path):
    """Two samples from a data loader, only the second past fp16's range: the overflow is still found."""
    (tmp_path / "two_feeds.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    return [{'x': np.full((1, 4), 1.0, np.float32)}, {'x': np.full((1, 4), 250.0, np.float32)}]\n"
    )
    importlib.invalidate_caches()
    path = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), path)
    s = _layerwise(run, path, "checker.backend=fp16_emulation", "data_loader=two_feeds.load").summary
    assert s["samples"] == 2 and s["top_introduced"][0]["node"] == "scale"
    assert s["first_divergence"]["node"] == "scale"


def test_a_reference_with_other_inputs_is_refused(run, tmp_path):
    path, other = tmp_path / "overflow.onnx", tmp_path / "chain.onnx"
    onnx.save(overflow_model(), path)
    renamed = chain_model(3)
    renamed.graph.input[0].name = "z"
    for n in renamed.graph.node:
        n.input[:] = ["z" if i == "x" else i for i in n.input]
    onnx.save(renamed, other)
    r = run("mode=layerwise", f"model={path}", f"reference_model={other}")
    assert r.returncode == 2 and "takes inputs ['z'] but the model takes ['x']" in r.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["checker=command", "checker.cmd=echo"], "use checker=compare"),
        (["golden=g.npz"], "drop golden="),
        (["layerwise.top=0"], "layerwise.top=0"),
        (["layerwise.max_memory_mb=-1"], "positive number"),
    ],
)
def test_bad_options(run, tmp_path, args, words):
    path = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), path)
    np.savez(tmp_path / "g.npz", y=np.zeros((1, 4), np.float32))
    r = run("mode=layerwise", f"model={path}", *[a.replace("g.npz", str(tmp_path / "g.npz")) for a in args])
    assert r.returncode == 2 and words in r.stderr


def test_a_comparison_and_its_alone_runs_go_with_their_last_reference():
    """The comparison held its target model in a reference cycle with its alone runs (a bound method as their
    key function), kept until the cyclic collector ran: on a 212 MB decoder, two 106 MB models through precision's
    first checks (peak 4.3x the model, now 3.6x: benchmarks/memory.py). Without a cycle, both go at once."""
    import gc
    import weakref

    model = name_nodes(chain_model(4, shape=(1, 8)))
    reference = make_backend("onnxruntime", graph_optimization_level="disable")
    lw = LayerwiseComparison(
        model,
        to_low_precision(model),
        {n.name for n in model.graph.node},
        weight_peaks(model),
        reference.run,
        make_backend("fp16_emulation"),
        Tolerances(stat="rel_l2"),
        "float16",
    )
    lw.run([{"x": np.ones((1, 8), np.float32)}])
    gone = [weakref.ref(lw), weakref.ref(lw.alone)]
    gc.disable()
    try:
        del lw
        assert [ref() for ref in gone] == [None, None], "no reference cycle keeps the comparison or its alone runs"
    finally:
        gc.enable()


def test_a_ranking_on_the_cuda_provider_takes_cudnns_default_algorithms():
    """A ranking is an order: its sessions do not pay cuDNN's exhaustive search that the checks may ask
    for; the checks' other provider options stay, and options without the CUDA provider are left alone."""
    from runner.checkers.compare.comparison import order_options

    exhaustive = {"CUDAExecutionProvider": {"cudnn_conv_algo_search": "EXHAUSTIVE", "use_tf32": "0"}}
    options = {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"], "provider_options": exhaustive}
    made = order_options(options)
    assert made["provider_options"]["CUDAExecutionProvider"] == {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": "0"}
    assert exhaustive["CUDAExecutionProvider"]["cudnn_conv_algo_search"] == "EXHAUSTIVE", "the checks' own untouched"
    assert order_options({"providers": ["CUDAExecutionProvider"]})["provider_options"] == {
        "CUDAExecutionProvider": {"cudnn_conv_algo_search": "DEFAULT"}
    }
    cpu = {"providers": ["CPUExecutionProvider"], "graph_optimization_level": "all"}
    assert order_options(cpu) == cpu
