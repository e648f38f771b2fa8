"""``builder.*`` (Polygraphy's ``debug build`` builder options): checked without TensorRT, a misspelt one is one
line; a valid one reaches the install line where TensorRT is absent (as every ``mode=build`` run here)."""

from __future__ import annotations

import importlib.util

import pytest

from runner.config import BuilderConf
from runner.errors import ConfigError
from runner.trt.builder_options import check_builder_options
from tests.helpers.cli import one_line_error


def test_the_keys_are_checked_and_named_as_tensorrt_names_them():
    conf = BuilderConf(
        optimization_level=5,
        tf32=False,
        flags=["SPARSE_WEIGHTS", "strip_plan"],
        hardware_compatibility_level="Ampere_Plus",
        max_aux_streams=0,
        tactic_sources=["cudnn", "cublas_lt"],
        tiling_optimization_level="full",
    )
    assert check_builder_options(conf) == {
        "optimization_level": 5,
        "tf32": False,
        "flags": ["sparse_weights", "strip_plan"],
        "max_aux_streams": 0,
        "hardware_compatibility_level": "ampere_plus",
        "tiling_optimization_level": "full",
        "tactic_sources": ["cudnn", "cublas_lt"],
    }
    assert check_builder_options(BuilderConf()) == {}, "nothing set: TensorRT's defaults"


@pytest.mark.parametrize(
    "conf, words",
    [
        (BuilderConf(optimization_level=6), "give 0 to 5"),
        (BuilderConf(flags=["sparse"]), "builder.flags=sparse: give one of sparse_weights"),
        (BuilderConf(max_aux_streams=-1), "give 0 or more"),
        (BuilderConf(profiling_verbosity="loud"), "builder.profiling_verbosity=loud"),
        (BuilderConf(tactic_sources=["cudnn", "magic"]), "builder.tactic_sources=magic"),
    ],
)
def test_a_wrong_value_names_the_key_and_the_choices(conf, words):
    with pytest.raises(ConfigError, match=words):
        check_builder_options(conf)


def test_through_the_command_line_before_and_after_looking_for_tensorrt(run, chain):
    args = ["mode=build", f"model={chain}", "until=1", "checker.cmd=true"]
    one_line_error(run(*args, "builder.flags=[sparse]"), "builder.flags=sparse", code=2)
    if importlib.util.find_spec("tensorrt") is None:  # as here and in CI: a valid setting gets the install line
        missing = run(*args, "builder.flags=[sparse_weights]", "builder.optimization_level=5")
        one_line_error(missing, "pip install", code=2)
