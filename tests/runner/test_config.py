"""Every pair of mode, marker and checker composes; wrong keys, types and choices fail before any work."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import sys
from pathlib import Path

import pytest
from hydra import compose
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class, get_method

import conf
from runner.errors import ConfigError
from tests.helpers.inprocess import ensure_hydra

CONF = Path(conf.__file__).parent
MODES = sorted(p.stem for p in (CONF / "mode").glob("*.yaml"))
MARKERS = sorted(p.stem for p in (CONF / "marker").glob("*.yaml"))
CHECKERS = sorted(p.stem for p in (CONF / "checker").glob("*.yaml"))


@pytest.fixture(scope="module", autouse=True)
def hydra_conf():
    ensure_hydra()


def test_groups_are_complete():
    assert MODES == ["build", "diff_tactics", "layerwise", "precision", "reduce", "repeat"]
    assert MARKERS == ["auto", "bisect", "linear", "minimal"]
    assert {"command", "interactive", "python", "compare"} <= set(CHECKERS)


#: every mode with every checker, the marker turning so that each mode and each checker meets every marker:
#: every pair of choices composes together (a pairwise covering array, 24 runs where all triples are 72)
PAIRS = [
    (m, MARKERS[(i + j) % len(MARKERS)], c)
    for (i, m), (j, c) in itertools.product(enumerate(MODES), enumerate(CHECKERS))
]


def test_the_combinations_cover_every_pair():
    for a, b in itertools.combinations(range(3), 2):
        groups = (MODES, MARKERS, CHECKERS)
        assert {(t[a], t[b]) for t in PAIRS} == set(itertools.product(groups[a], groups[b]))


@pytest.mark.parametrize("mode, marker, checker", PAIRS)
@pytest.mark.slow
def test_every_pair_of_choices_composes(mode, marker, checker):
    cfg = compose(
        "config", overrides=[f"mode={mode}", f"marker={marker}", f"checker={checker}"], return_hydra_config=True
    )
    assert cfg.mode.name == mode
    assert get_method(cfg.mode._target_) is not None
    assert get_class(cfg.marker._target_) is not None
    assert get_class(cfg.checker._target_) is not None


@pytest.mark.parametrize(
    "override",
    [
        "nonsense=1",
        "checker.nonsense=1",
        "marker=nope",
        "seed=abc",
        "reduce_inputs=maybe",
        "direction=sideways",
        "artifacts.keep_intermediate=perhaps",
    ],
)
def test_bad_overrides_are_rejected(override):
    with pytest.raises(ConfigCompositionException):
        compose("config", overrides=[override])


def test_model_input_shapes_take_a_dict():
    cfg = compose("config", overrides=["model_input_shapes={x:[1,3,160,160]}"])
    assert dict(cfg.model_input_shapes) == {"x": [1, 3, 160, 160]}


@pytest.mark.slow
def test_help_lists_modes_and_checkers(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "runner", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0
    for word in [*MODES, "command", "compare", "interactive", "checker.cmd", "until="]:
        assert word in proc.stdout, word


def _readme_commands():
    import re
    import shlex

    root = Path(__file__).resolve().parents[2]
    text = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("pip install") and "&&" in line:
                line = line.split("&&", 1)[1].strip()
            if line.startswith("python -m runner") and " -m " not in line[16:] and "--config-path" not in line:
                yield shlex.split(line)[3:]


@pytest.mark.parametrize("overrides", list(_readme_commands()), ids=lambda o: " ".join(o)[:60])
@pytest.mark.slow
def test_every_readme_command_composes_and_uses_only_its_modes_keys(overrides):
    from runner.config_keys import check_mode_keys, set_keys

    cfg = compose("config", overrides=overrides)
    check_mode_keys(cfg.mode.name, set_keys(overrides))


def test_each_mode_is_one_module_whose_create_takes_its_keys_whole():
    """The mode group lists the modes; each module exports KEYS; every create() takes the context, the keys
    dataclass whole and the built checker and marker by keyword: the keys are declared once, in KEYS."""
    from omegaconf import OmegaConf

    from runner.config_keys import mode_keys

    modes = mode_keys()
    assert set(modes) == {"reduce", "precision", "layerwise", "repeat", "build", "diff_tactics"}
    for path in (Path(conf.__file__).parent / "mode").glob("*.yaml"):
        spec = OmegaConf.load(path)
        parameters = inspect.signature(get_method(str(spec._target_))).parameters
        assert list(parameters) == ["ctx", "keys", "checker", "marker"], spec.name
        assert [p.kind for p in parameters.values()][2:] == [inspect.Parameter.KEYWORD_ONLY] * 2, spec.name


def test_keys_of_fills_a_modes_keys_from_the_config_with_enums_and_nested_schemas():
    from runner.config import CalibrationConf, Direction, Precision
    from runner.config_keys import keys_of

    cfg = compose(
        "config",
        overrides=[
            "mode=precision",
            "marker=bisect",
            "direction=ranked",
            "low_precision=int8",
            "calibration.samples=4",
            "include_nodes=[a.*]",
        ],
    )
    keys = keys_of("precision", cfg)
    assert keys.direction is Direction.ranked and keys.low_precision is Precision.int8
    assert keys.calibration == CalibrationConf(samples=4) and keys.include_nodes == ["a.*"]
    with pytest.raises(ConfigError, match="mode=precision"):
        keys_of("precision", {"low_precision": "float4"})


def test_the_keys_that_change_candidates_are_marked_on_the_keys_themselves():
    """A replay recorded with other values of these is not reused (runner.files.identity)."""
    from runner.config_keys import candidate_options

    assert candidate_options() == [
        "builder",
        "calibration",
        "compare_every_tensor",
        "data_loader_max_mb",
        "data_loader_max_samples",
        "exclude_nodes",
        "exclude_op_types",
        "external_data",
        "external_data_threshold",
        "include_nodes",
        "include_op_types",
        "iterations",
        "keep_constant_nodes",
        "low_precision",
        "model_input_shapes",
        "precision",
        "quantization",
        "quantized_model",
        "seed",
        "shape_inference",
        "share_weights",
        "weak_typing",
        "workspace",
    ]


@pytest.mark.parametrize(
    "override, choices",
    [
        ("checker.on_error=maybe", "[fail, pass, stop]"),
        ("checker.check_error_stat=p99", "[elemwise, max, mean, median, quantile, rel_l2]"),
        ("checker.graph_optimization_level=max", "[disable, basic, extended, all]"),
    ],
)
def test_checker_choices_are_enums_checked_before_the_run(override, choices):
    """The schema's enums: Hydra refuses a value outside them at composition, naming the choices; a valid one
    reaches the checker as the plain name it compares with."""
    from runner.checkers.compare import CompareChecker
    from runner.run.assembly import _build_checker
    from runner.run.plan import checker_plan

    ensure_hydra()
    with pytest.raises(ConfigCompositionException) as refused:
        compose("config", overrides=["checker=compare", override])
    assert choices in str(refused.value.__cause__ or refused.value)
    cfg = compose("config", overrides=["checker=compare", "checker.on_error=pass", "checker.check_error_stat=rel_l2"])
    checker = _build_checker(checker_plan(cfg))
    assert isinstance(checker, CompareChecker) and checker.on_error.value == "pass" and checker.rule.stat == "rel_l2"


def test_help_lists_every_mode_from_its_yaml():
    from runner.config_keys import mode_keys
    from runner.terminal.help import render

    text = render()
    lines = text[text.index("Modes (mode=...)") : text.index("Markers (marker=...)")].splitlines()[1:]
    listed = [line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")]
    assert listed == ["reduce", "precision", "layerwise", "repeat", "build", "diff_tactics"]
    assert set(listed) == set(mode_keys())


def test_help_lists_every_key_of_every_group():
    """``--help`` is generated from the schemas (read from their source, so it imports no Hydra, onnx or ONNX
    Runtime: 0.05 s): every field of every mode's keys, checker, executor and the common keys is in it."""

    from conf import checker_schema, executor_groups, executor_schema
    from runner import config
    from runner.config_keys import mode_keys
    from runner.terminal.help import render

    text = render()

    def names(cls, prefix=""):
        for f in dataclasses.fields(cls):
            if f.name in ("_target_", "name", "checker", "executor", "mode"):
                continue
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(default):
                yield from names(type(default), f"{prefix}{f.name}.")
            else:
                yield prefix + f.name

    for mode, keys in mode_keys().items():
        assert f"  {mode} " in text
        for key in names(keys):
            assert f"{key}=" in text, (mode, key)
    for checker in CHECKERS:  # the group files: the one list of checkers
        assert f"/{checker}_schema@_here_" in (CONF / "checker" / f"{checker}.yaml").read_text(), checker
        assert f"  {checker} " in text, checker
        for key in names(getattr(config, checker_schema(checker)), "checker."):
            assert f"{key}=" in text, key
    for executor in executor_groups():  # the group files: the one list of executors, each with its schema
        assert f"/{executor}_executor_schema@_here_" in (CONF / "executor" / f"{executor}.yaml").read_text()
        assert f"  {executor} " in text, executor
        for key in names(getattr(config, executor_schema(executor)), "executor."):
            assert key in ("executor._target_", "executor.name") or f"{key}=" in text, key
    for key in names(config.CommonKeys):
        assert f"{key}=" in text, key
    assert "used_with=" not in text and "not_with=" not in text, "a keys class's ClassVars are no keys"


@pytest.mark.parametrize(
    "overrides, level",
    [
        (["mode=precision", "low_precision=int8"], "disable"),  # TensorRT's placement: switched runs
        (["mode=precision", "low_precision=int8", "quantization.placement=onnxruntime"], None),
        (["mode=precision", "low_precision=int8", "checker.graph_optimization_level=all"], "all"),  # as given
        (["mode=precision"], None),  # fp16: the checker decides by its backend
        (["mode=layerwise"], None),
    ],
)
def test_int8_precision_checks_with_tensorrts_placement_run_their_qdq_as_written(overrides, level):
    from runner.run.plan import checker_plan

    ensure_hydra()
    cfg = compose("config", overrides=["checker=compare", *overrides])
    assert checker_plan(cfg).options["graph_optimization_level"] == level


def test_help_with_overrides_is_the_generated_help():
    """``python -m runner KEY=VALUE --help`` (Hydra's help template) prints the help generated from the
    schemas above the composed config, not a hand-written copy: every key of compare is in it."""
    from omegaconf import OmegaConf

    from runner.terminal.help import render

    ensure_hydra()
    cfg = compose("config", overrides=["checker=compare"], return_hydra_config=True)
    template = OmegaConf.select(cfg, "hydra.help.template")
    assert template.startswith(render())
    assert "checker.check_error_stat=" in template and "$CONFIG" in template


def test_a_cli_run_composes_its_config_once(tmp_path, monkeypatch):
    """``hydra.main`` composes the whole config once more only to read ``hydra.mode``; ``python -m runner``
    skips that (``runner.__main__._one_composition``) unless the mode may come from the config, and the
    run is the same."""
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    from runner.__main__ import _hydra_main  # cli() less its signal handlers, which would stay in this process

    GlobalHydra.instance().clear()  # as a fresh process has it (tests that compose set it up again)

    composed = []
    original = Hydra.compose_config

    def counted(self, *args, **kwargs):
        composed.append(kwargs.get("run_mode"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Hydra, "compose_config", counted)
    monkeypatch.chdir(tmp_path)
    get_mode = Hydra.get_mode
    for i, extra in enumerate([[], ["hydra.mode=RUN"]]):
        composed.clear()
        run_dir = tmp_path / f"run{i}"
        monkeypatch.setattr(
            sys, "argv", ["runner", "mode=repeat", "until=1", "checker.cmd=true", f"hydra.run.dir={run_dir}", *extra]
        )
        assert _hydra_main() == 0
        assert json.loads((run_dir / "summary.json").read_text())["checks"] == 1
        assert len(composed) == (1 if not extra else 2), composed
    assert Hydra.get_mode is get_mode, "Hydra's own get_mode is back after the run"
