"""What a precision search runs over: int8's second ranking on the switchboard, against candidates built one by one."""

from __future__ import annotations

import functools

import onnx

from runner.backends.base import make_backend
from runner.context import RunContext
from runner.layerwise.output_ranking import output_error_ranking
from runner.lowp.calibration import calibrate
from runner.lowp.makers import PlacedMaker, make_maker
from runner.lowp.precisions import INT8
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import prepare_int8
from strategies.precision.output_order import OutputErrorOrder
from tests.helpers.int8 import dense_model, samples


def test_the_second_ranking_on_the_switchboard_is_the_built_candidates_order(tmp_path, int8_feeds):
    """TensorRT's placement: each "node alone quantized" candidate as switch feeds gives the order its
    built model gives (both with ONNX Runtime's optimizations off, as the checks run)."""
    model = prepare_int8(dense_model(24, channels=8))
    path = tmp_path / "dense.onnx"
    onnx.save(model, path)
    feeds = list(samples())  # the loader's
    ctx = RunContext(mode="precision", run_dir=tmp_path, model_path=path, data_loader=f"{int8_feeds}.pages")
    maker = make_maker(model, INT8, calibrate(model, feeds, QuantOptions()), QuantOptions())
    assert isinstance(maker, PlacedMaker)  # TensorRT's placement is the default
    nodes = [i for i, n in enumerate(model.graph.node) if n.name in maker.quantizer.sites]
    assert len(nodes) == 24
    switched = OutputErrorOrder(ctx, model, frozenset(nodes), maker, None, maker.switchboard("k"))
    order = switched(nodes)
    assert switched.facts is not None and switched.facts["switched"] is True
    built = OutputErrorOrder(ctx, model, frozenset(nodes), maker, None)
    backend = make_backend("onnxruntime", graph_optimization_level="disable", cpu_arena=False)
    builds = [(i, functools.partial(built._alone, i)) for i in nodes]
    assert order == output_error_ranking(builds, model, ctx.samples, backend)
    assert order != nodes, "a spread of scales: not the topological order"


def test_the_second_ranking_on_a_device_runs_the_switchboard_without_ifs(tmp_path, int8_feeds):
    """On a device's ONNX Runtime provider the second ranking takes fp16's native switchboard (each switch a
    ``Where``: an ``If`` costs the CUDA provider a cuBLAS handle, and a 0.5B decoder's 1,628 ran an H200 out of
    memory); on CPU (no device backend) the emulation's; int8's, which has only ``If`` switches, that one on both
    (a switched run that fails hands its candidates to their builds: ``runner.layerwise.output_ranking``)."""
    from examples.planted import rmsnorm_decoder
    from runner.backends.onnxruntime import OnnxRuntimeBackend
    from runner.lowp.convert import float_nodes, prepare
    from runner.lowp.precisions import FLOAT16

    model = prepare(rmsnorm_decoder(layers=2)[0])
    path = tmp_path / "dec.onnx"
    onnx.save(model, path)
    ctx = RunContext(mode="precision", run_dir=tmp_path, model_path=path)
    maker = make_maker(model, FLOAT16)
    order = OutputErrorOrder(ctx, model, frozenset(float_nodes(model)), maker, None, maker.switchboard("k"))
    device = OnnxRuntimeBackend(graph_optimization_level="disable")  # the class a device's checker ranks on
    on_cpu, on_device = order._board(None), order._board(device)
    assert on_cpu is not None and on_device is not None
    assert "If" in {n.op_type for n in on_cpu.model.graph.node}
    assert "If" not in {n.op_type for n in on_device.model.graph.node}
    int8 = prepare_int8(dense_model(4, channels=8))
    placed = make_maker(int8, INT8, calibrate(int8, list(samples()), QuantOptions()), QuantOptions())
    nodes = frozenset(i for i, n in enumerate(int8.graph.node) if n.name in placed.quantizer.sites)
    int8_order = OutputErrorOrder(ctx, int8, nodes, placed, None, placed.switchboard("q"))
    assert int8_order._board(None) is not None and int8_order._board(device) is int8_order._board(None)


def test_a_second_ranking_past_the_budgets_half_stops_and_the_first_ranking_stays(tmp_path, int8_feeds):
    """``budget.seconds``: the ranking may take half of what is left; past it (here a budget spent but for a
    second) it stops after its first runs, keeps the given order and says so in ``ranked_again``; with time
    to spare it ranks."""
    import time

    from strategies.budget import Budget

    model = prepare_int8(dense_model(24, channels=8))
    path = tmp_path / "dense.onnx"
    onnx.save(model, path)
    ctx = RunContext(mode="precision", run_dir=tmp_path, model_path=path, data_loader=f"{int8_feeds}.pages")
    maker = make_maker(model, INT8, calibrate(model, list(samples()), QuantOptions()), QuantOptions())
    nodes = [i for i, n in enumerate(model.graph.node) if n.name in maker.quantizer.sites]
    order = OutputErrorOrder(ctx, model, frozenset(nodes), maker, None, maker.switchboard("k"))
    order.budget = Budget(seconds=100.0, started=time.monotonic() - 99.99)
    assert order(nodes) == nodes
    assert order.facts is not None and order.facts["skipped"] == "budget" and order.facts["nodes"] == len(nodes)
    order.budget = Budget(seconds=1000.0)
    ranked = order(nodes)
    assert ranked != nodes and sorted(ranked) == sorted(nodes)
    assert "skipped" not in order.facts and "read" not in order.facts, "the stopped ranking was not stored"
