"""The run's plan (``runner.run.plan``) and its summary record (``runner.run.summary``): the config read once and
frozen, output paths resolved into a new plan, and ``summary.json``'s fields as scripts read them."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from runner.config import Start
from runner.errors import ConfigError
from runner.run.plan import checker_plan, plan
from runner.run.summary import Summary
from tests.helpers.models import CLASSIFIER


def _config(**keys):
    """A composed-like config without Hydra's interpolations: what ``plan`` reads."""
    base = {
        "mode": {"name": "reduce", "_target_": "strategies.reduce.create", "default_output": "reduced.onnx"},
        "model": str(CLASSIFIER),
        "checker": {"_target_": "runner.checkers.compare.CompareChecker", "isolate": False, "timeout_s": None},
        "executor": {"name": "serial", "_target_": "runner.executors.serial.SerialExecutor", "workers": None},
        "output": None,
        "replay": {"save": "replay.json", "load": None},
    }
    base.update(keys)
    return OmegaConf.create(base)


def test_the_plan_is_read_only_and_with_outputs_makes_a_new_one(tmp_path):
    given = plan(_config())
    assert given.mode == "reduce" and given.model == CLASSIFIER and len(given.model_files) == 1
    assert list(given.files_read.values()) == ["the model"]
    with pytest.raises(ReadonlyConfigError):
        given.config.output = "elsewhere.onnx"
    requested, defaults = given.requested_outputs()
    assert requested["output"] is None and requested["replay.save"] == "replay.json"
    assert defaults == {"output": "reduced.onnx"}
    resolved = given.with_outputs({"output": tmp_path / "reduced.onnx", "summary": None})
    assert resolved.get("output") == str(tmp_path / "reduced.onnx") and resolved.outputs_resolved
    assert given.get("output") is None and not given.outputs_resolved, "the first plan is unchanged"
    with pytest.raises(ReadonlyConfigError):
        resolved.config.output = "elsewhere.onnx"


def test_the_plan_refuses_what_cannot_go_together_before_anything_is_built():
    with pytest.raises(ConfigError, match=r"checker\.isolate=true with executor=processes"):
        plan(_config(checker={"_target_": "x.Y", "isolate": True}, executor={"name": "processes", "workers": 2}))
    with pytest.raises(ConfigError, match=r"set checker\.isolate=true"):
        checker_plan(OmegaConf.create({"checker": {"_target_": "x.Y", "isolate": False, "timeout_s": 5}}))
    with pytest.raises(ConfigError, match="above 0"):
        checker_plan(OmegaConf.create({"checker": {"_target_": "x.Y", "isolate": True, "timeout_s": 0}}))
    command = checker_plan(OmegaConf.create({"checker": {"_target_": "x.Command", "timeout_s": 5}}))
    assert command.options["timeout_s"] == 5 and not command.isolate, "a command checker's own timeout_s"
    assert plan(_config(executor={"name": "processes", "workers": 2, "start": Start.now})).executor.options == {
        "workers": 2,
        "start": Start.now,
    }, "an executor's keys, enums as enums, without the schema's _target_ and name"


def test_a_key_of_another_executor_is_refused_as_the_config_is_composed():
    """Each executor's schema holds its own keys: Hydra refuses another's, and the line names the executors
    that take it (``executor=serial`` takes no GPUs)."""
    from hydra import compose
    from hydra.errors import ConfigCompositionException

    from runner.__main__ import composition_error
    from tests.helpers.inprocess import ensure_hydra

    ensure_hydra()
    with pytest.raises(ConfigCompositionException) as refused:
        compose("config", ["mode=reduce", "executor=serial", "executor.gpus=[0]"])
    assert composition_error(refused.value) == (
        "executor.gpus= is not used by executor=serial; it is an option of executor=dask, executor=local, "
        "executor=processes"
    )
    assert compose("config", ["mode=reduce", "executor=processes", "executor.start=now"]).executor.start is Start.now


def test_the_summary_writes_the_fields_scripts_read_in_their_order():
    summary = Summary("precision")
    assert summary.as_json() == {"mode": "precision", "status": "ok", "iterations": 0, "checks": 0, "reused": 0}
    summary.answer = {"kept_nodes": [{"name": "n1"}]}
    summary.replay = "replay.json"
    summary.counters = {"check_s": 1.5, "executor": "serial", "workers_started_s": None}
    summary.status, summary.error = "answer not verified", "it passed"
    summary.finish()
    written = summary.as_json()
    assert list(written) == [
        "mode", "status", "iterations", "checks", "reused", "kept_nodes", "replay", "error",
        "check_s", "executor", "workers_started_s", "wall_s",
    ]  # fmt: skip
    assert json.loads(json.dumps(written)) == written and written["wall_s"] >= 0
