"""Switched runs: when the compare checker runs precision's fp16 candidates on their switchboard,
the cross-check of the first ones, and a precision run's answers and artifacts with and without it."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest

from examples.planted import rmsnorm_decoder, two_branches
from runner.backends.fp16_emulation import EmulationBackend
from runner.candidates import Candidate
from runner.checkers.base import Need
from runner.checkers.compare import CompareChecker
from runner.checkers.compare.switched import CROSS_CHECKS, SPOT_EVERY, SwitchedRuns
from runner.checkers.isolated import IsolatedChecker
from runner.lowp.convert import Converter, prepare
from runner.lowp.fp16_switchboard import build_switchboard
from runner.lowp.precisions import FLOAT16
from runner.lowp.switchboard import LazySwitchboard, RunsOn, Switched


def _lazy(model, converter):
    return LazySwitchboard(lambda: build_switchboard(model, converter, "b"))


@pytest.mark.parametrize(
    "options, on",
    [
        ({"backend": "fp16_emulation"}, True),
        ({"backend": "fp16_emulation", "switchboard": False}, False),
        ({"backend": "fp16_emulation", "graph_optimization_level": "all"}, False),  # fused: other bits
        ({"backend": "fp16_emulation", "outputs": ["y"]}, True),  # a graph output
        ({"backend": "fp16_emulation", "exclude_outputs": ["y"]}, True),
        ({"backend": "fp16_emulation", "outputs": ["pa"]}, False),  # intermediate: the switched model marks none
        ({"backend": "bf16_emulation"}, True),  # the same emulation: each type rounds to itself
        ({"backend": "onnxruntime", "low_precision": "float16"}, False),  # fp16 kernels, not the emulation
    ],
)
def test_switched_runs_only_where_they_give_the_candidates_bits(options, on):
    checker = CompareChecker.of(**options)
    model, _, _ = two_branches()
    checker.switched.bind(model)
    prepared = prepare(model, FLOAT16)
    candidate = Candidate("k", "c", switched=Switched(_lazy(prepared, Converter(prepared)), frozenset()))
    assert (checker.needs(candidate) is Need.nothing) is on
    assert checker.needs(Candidate("k", "c")) is Need.file, "a candidate with no switchboard runs as itself"
    assert checker.needs(Candidate("k", "c", payload=lambda: model)) is Need.model
    isolated = IsolatedChecker(checker)
    assert isolated.needs(candidate) is Need.file, "a child process holds no switchboard: it reads the file"


def _runs(kept_built, kept_switched, left=CROSS_CHECKS):
    model, _, _ = two_branches()
    prepared = prepare(model, FLOAT16)
    converter = Converter(prepared, FLOAT16)
    names = [n.name for n in prepared.graph.node]
    runs = SwitchedRuns(EmulationBackend(), True, True, "disable", [], cross_checks=left)
    built = converter.convert([names[i] for i in kept_built])
    candidate = Candidate(
        "k",
        "the candidate",
        payload=lambda: built,
        switched=Switched(_lazy(prepared, converter), frozenset(kept_switched)),
    )
    feeds = {"x": np.linspace(0.5, 3.0, 8, dtype=np.float32).reshape(1, 8)}
    board, switches = runs.board(candidate)
    return runs, candidate, runs.run(board, switches, feeds, ["y"]), feeds, switches


def test_a_cross_check_that_agrees_keeps_switched_runs_on():
    runs, candidate, got, feeds, switches = _runs({1}, {1})
    assert runs.agrees(candidate, got, feeds, switches) and runs.takes(candidate)


def test_a_cross_check_that_disagrees_turns_switched_runs_off(caplog):
    """A switched model that does not give the built candidate's values (here: other switches) is
    caught on the first candidates, and every later candidate is built and run as itself."""
    runs, candidate, got, feeds, switches = _runs({1}, {0})
    assert not np.isfinite(got["y"]).all(), "the switched run overflows where the built candidate keeps mul_a"
    with caplog.at_level(logging.WARNING):
        assert not runs.agrees(candidate, got, feeds, switches)
    assert "disagree" in caplog.text and not runs.takes(candidate)


def test_after_the_cross_checks_the_candidate_is_never_built():
    runs, candidate, got, feeds, switches = _runs({1}, {0}, left=0)

    def never():
        raise AssertionError("built after the cross-checks")

    candidate.payload = never
    assert runs.agrees(candidate, got, feeds, switches)


def test_the_gates_are_no_cross_check_and_one_candidate_in_spot_every_is_built_again():
    """With every switch one way a switched model is the model or its whole conversion: such a candidate uses
    up no cross-check (the gates come first, and a switched model wrong only for mixed kept sets passed them);
    after the cross-checks, the ``SPOT_EVERY``-th mixed candidate is built and run as itself again."""
    runs, candidate, got, feeds, switches = _runs({1}, {1}, left=1)
    model, built = candidate.payload(), []
    candidate.payload = lambda: built.append(1) or model
    gate = {name: np.array(True) for name in switches}
    assert runs.agrees(candidate, got, feeds, gate) and not built, "a gate: not built, no cross-check used"
    assert runs.agrees(candidate, got, feeds, switches) and len(built) == 1, "the cross-check"
    for _ in range(SPOT_EVERY - 1):
        assert runs.agrees(candidate, got, feeds, switches)
    assert len(built) == 1
    assert runs.agrees(candidate, got, feeds, switches) and len(built) == 2, "the SPOT_EVERY-th: built again"
    assert runs.takes(candidate)


def _precision(run, tmp_path, name, *extra):
    model, _, ids = rmsnorm_decoder()
    path = tmp_path / "decoder.onnx"
    if not path.exists():
        onnx.save(model, path)
        np.savez(tmp_path / "ids.npz", ids=ids)
    return run(
        "mode=precision",
        "marker=minimal",
        f"model={path}",
        f"inputs={tmp_path / 'ids.npz'}",
        f"output={tmp_path / name}.onnx",
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.check_error_stat=rel_l2",
        "checker.atol=0",
        "checker.rtol=0.05",
        *extra,
    )


@pytest.mark.slow
def test_a_switched_precision_run_gives_the_verdicts_and_answer_of_built_candidates(run, tmp_path):
    """The RMSNorm decoder's four nodes, the same verdict for every iteration, the answer verified as
    written; the switched run writes no iteration artifact unless asked to keep them all."""
    switched = _precision(run, tmp_path, "switched", "artifacts.keep_intermediate=true")
    built = _precision(run, tmp_path, "built", "checker.switchboard=false")
    assert switched.returncode == built.returncode == 0, switched.stderr[-2000:] + built.stderr[-2000:]
    log = (switched.run_dir / "runner.log").read_text()
    assert "run on one switched model" in log and "disagree" not in log
    assert "run on one switched model" not in (built.run_dir / "runner.log").read_text()
    verdicts = [(i["key"], i["passed"], measured(i["details"]["outputs"])) for i in switched.replay["iterations"]]
    assert verdicts == [(i["key"], i["passed"], measured(i["details"]["outputs"])) for i in built.replay["iterations"]]
    assert switched.summary["kept_nodes"] == built.summary["kept_nodes"] and switched.summary["kept"] == 4
    assert switched.summary["answer_verified"]["check_passed"]
    # every check but the model as given and the written answer ran switched; the built run none
    assert switched.summary["switched_checks"] == switched.summary["checks"] - 2
    assert "switched_checks" not in built.summary
    kept = sorted((switched.run_dir / "artifacts" / "intermediate").iterdir())
    assert len(kept) == switched.summary["checks"], "keep_intermediate: every iteration's model, switched or not"
    onnx.checker.check_model(str(kept[3]))


@pytest.mark.slow  # two precision runs
def test_a_compare_precision_run_writes_no_iteration_artifact_unless_kept(run, tmp_path):
    r = _precision(run, tmp_path, "mixed")
    assert r.returncode == 0, r.stderr[-2000:]
    # the compare checker runs each candidate's in-memory model: no check reads a file, so none is written
    assert not (r.run_dir / "iter_artifact.onnx").exists()
    assert json.loads((r.run_dir / "summary.json").read_text())["kept"] == 4
    kept = _precision(run, tmp_path, "kept", "artifacts.keep_intermediate=true")
    written = sorted((kept.run_dir / "artifacts" / "intermediate").glob("*.onnx"))
    assert len(written) == kept.summary["checks"]  # every check's candidate, the answer's file included


def test_a_checker_with_switched_runs_pickles():
    """A checker is sent to worker processes (executor=processes, dask, checker.isolate)."""
    import pickle

    checker = pickle.loads(pickle.dumps(CompareChecker.of(backend="fp16_emulation")))
    model, _, _ = two_branches()
    prepared = prepare(model, FLOAT16)
    candidate = Candidate("k", "c", switched=Switched(_lazy(prepared, Converter(prepared)), frozenset()))
    assert checker.needs(candidate) is Need.nothing


@pytest.mark.slow
def test_threads_run_switched_checks_and_give_the_serial_answer(run, tmp_path):
    """executor=local: checks in threads of this process share the switchboard's session; no model is
    built for them, ahead or not."""
    serial = _precision(run, tmp_path, "serial")
    threads = _precision(run, tmp_path, "threads", "executor=local", "executor.workers=2")
    assert threads.returncode == 0, threads.stderr[-2000:]
    assert threads.summary["kept_nodes"] == serial.summary["kept_nodes"]
    assert threads.summary["switched_checks"] == threads.summary["checks"] - 2
    assert "built ahead" not in (threads.run_dir / "runner.log").read_text()


@pytest.mark.slow
def test_detections_on_graph_outputs_run_switched(run, tmp_path):
    """A detector whose outputs are decisions, judged by its detections (graph outputs): the same
    verdicts switched as built, with rows that depend on the data."""
    from examples.planted import threshold_detector

    model, x = threshold_detector()
    onnx.save(model, tmp_path / "det.onnx")
    np.savez(tmp_path / "x.npz", x=x * 3e4)  # past fp16's range: some candidates lose boxes
    argv = ["mode=precision", "marker=minimal", f"model={tmp_path / 'det.onnx'}", f"inputs={tmp_path / 'x.npz'}"]
    argv += ["checker=compare", "checker.backend=fp16_emulation", "checker.detections={boxes: boxes, scores: scores}"]
    switched = run(*argv, f"output={tmp_path / 'a.onnx'}")
    built = run(*argv, f"output={tmp_path / 'b.onnx'}", "checker.switchboard=false")
    assert switched.returncode == built.returncode == 0, switched.stderr[-2000:]
    assert switched.summary["switched_checks"] > 0 and "switched_checks" not in built.summary
    assert [i["passed"] for i in switched.replay["iterations"]] == [i["passed"] for i in built.replay["iterations"]]
    assert switched.summary["kept_nodes"] == built.summary["kept_nodes"]


@pytest.mark.parametrize(
    "options, on",
    [
        ({"graph_optimization_level": "disable"}, True),  # as int8 precision with TensorRT's placement plans it
        ({"graph_optimization_level": "all"}, False),  # fused: other bits
        ({"graph_optimization_level": "disable", "switchboard": False}, False),
        ({"backend": "fp16_emulation"}, False),  # an fp16 board's runner, not an int8 one's
    ],
)
def test_int8_switchboards_run_on_onnxruntime_with_optimizations_off(options, on):
    checker = CompareChecker.of(**options)
    qdq = Candidate("k", "c", switched=Switched(LazySwitchboard(lambda: None, RunsOn.ONNXRUNTIME), frozenset()))
    assert (checker.needs(qdq) is Need.nothing) is on
    fp16 = Candidate("k", "c", switched=Switched(LazySwitchboard(lambda: None, RunsOn.EMULATION), frozenset()))
    assert (checker.needs(fp16) is Need.nothing) is (options.get("backend") == "fp16_emulation")


def _int8(run, tmp_path, int8_feeds, name, *extra):
    from tests.helpers.int8 import dense_model

    model = tmp_path / "dense.onnx"
    if not model.exists():
        onnx.save(dense_model(channels=8), model)
    argv = ["mode=precision", "low_precision=int8", "marker=minimal", f"model={model}"]
    argv += [f"data_loader={int8_feeds}.pages", "checker=compare", "checker.check_error_stat=rel_l2"]
    # verified on the search's own arithmetic only: at level ``all`` ONNX Runtime fuses the 64 Convs into its
    # int8 kernels, which saturate on CPUs without VNNI (rel L2 0.058 against the search's 0.013 on AVX2)
    argv += ["checker.verify_on=[cpu:disable]"]
    return run(*argv, "checker.atol=0", "checker.rtol=0.02", f"output={tmp_path / name}.onnx", *extra)


@pytest.mark.slow
def test_an_int8_run_with_tensorrts_placement_runs_switched_and_gives_the_built_answer(run, tmp_path, int8_feeds):
    """64 Convs of 8 channels, each one's int8 rounding adding error (many needed): the checks run as feeds
    of the switchboard and so does the second ranking; every verdict and the answer are the built run's."""
    switched = _int8(run, tmp_path, int8_feeds, "switched")
    built = _int8(run, tmp_path, int8_feeds, "built", "checker.switchboard=false")
    assert switched.returncode == built.returncode == 0, switched.stderr[-2000:] + built.stderr[-2000:]
    s = switched.summary
    assert s["switched_checks"] == s["checks"] - 2 and "switched_checks" not in built.summary
    assert s["ranked_again"]["switched"] is True and s["ranked_again"]["nodes"] == 64
    verdicts = [(i["key"], i["passed"], measured(i["details"]["outputs"])) for i in switched.replay["iterations"]]
    assert verdicts == [(i["key"], i["passed"], measured(i["details"]["outputs"])) for i in built.replay["iterations"]]
    assert s["kept_nodes"] == built.summary["kept_nodes"] and s["kept"] > 32
    assert s["answer_verified"]["check_passed"] is True
    assert "disagree" not in (switched.run_dir / "runner.log").read_text()


def test_a_devices_provider_runs_fp16_candidates_on_their_native_switchboard():
    """ONNX Runtime on a device's provider (cpu_only false: CUDA's) with optimizations off runs fp16 candidates as
    feeds of the maker's native switchboard (``RunsOn.DEVICE``), and neither int8 switchboards (planned on CPU)
    nor the emulation's; the CPU provider runs no native one (it computes runs of fp16 nodes in fp32)."""
    from runner.backends.onnxruntime import OnnxRuntimeBackend
    from runner.checkers.compare.switched import SwitchedRuns
    from runner.lowp.makers import CastMaker

    model, _, _ = two_branches()
    prepared = prepare(model, FLOAT16)
    maker = CastMaker(Converter(prepared, FLOAT16))
    fp16 = Candidate("k", "c", switched=Switched(maker.switchboard("b"), frozenset()))
    int8 = Candidate("k", "c", switched=Switched(LazySwitchboard(lambda: None, RunsOn.ONNXRUNTIME), frozenset()))
    backend = OnnxRuntimeBackend(graph_optimization_level="disable")
    device = SwitchedRuns(backend, True, cpu_only=False, level="disable", named=[])
    assert device.runs is RunsOn.DEVICE and device.takes(fp16) and not device.takes(int8)
    found = device.board(fp16)
    assert found is not None and found[0] is maker.switchboard("b").get(RunsOn.DEVICE)
    assert found[0] is not maker.switchboard("b").get(), "the emulation's board is another"
    assert not SwitchedRuns(backend, True, cpu_only=False, level="all", named=[]).takes(fp16), "fused: other bits"
    cpu = SwitchedRuns(backend, True, cpu_only=True, level="disable", named=[])
    assert cpu.runs is RunsOn.ONNXRUNTIME and not cpu.takes(fp16) and cpu.takes(int8)


def test_a_disagreement_after_switched_verdicts_makes_the_answer_not_minimal(caplog):
    """Verdicts the search took from a switched model that a later cross-check finds wrong stay taken: the run
    says so (``switched_disagreed``, ``minimal: false`` with why); a disagreement on the first switched check
    leaves nothing to say."""
    first, candidate, got, feeds, switches = _runs({1}, {0})
    assert not first.agrees(candidate, got, feeds, switches) and first.disagreed is None
    runs, candidate, got, feeds, switches = _runs({1}, {0}, left=0)
    for _ in range(SPOT_EVERY - 1):  # switched checks the search took, none built again
        assert runs.agrees(candidate, got, feeds, switches)
        runs.counted(True)
    with caplog.at_level(logging.WARNING):
        assert not runs.agrees(candidate, got, feeds, switches), "the SPOT_EVERY-th is built again, and differs"
    assert runs.disagreed is not None and runs.disagreed["switched_checks_before"] == SPOT_EVERY - 1
    assert "minimal: false" in caplog.text
    checker = CompareChecker.of(backend="fp16_emulation", low_precision="float16")
    checker.switched = runs
    facts = checker.facts()
    assert facts["minimal"] is False and "checker.switchboard=false" in facts["minimal_why"]
    assert facts["switched_disagreed"]["candidate"] == "the candidate"


def measured(outputs: dict) -> dict:
    """A verdict's statistics without the limit each was judged by: the run's own (a search margin or none)."""
    return {name: {k: v for k, v in stats.items() if k != "limit"} for name, stats in outputs.items()}
