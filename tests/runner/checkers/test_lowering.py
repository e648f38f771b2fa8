"""An fp32 candidate as a low-precision check runs it, and the warning for fp16 on ONNX Runtime's CPU provider."""

from __future__ import annotations

import logging

from examples.planted import two_branches
from runner.checkers.compare.lowering import warn_fp16_on_cpu
from runner.lowp.convert import Converter, prepare
from runner.lowp.precisions import FLOAT16


def test_an_fp16_model_warns_that_the_cpu_can_hide_overflows_and_an_fp32_one_does_not(caplog):
    model, _, _ = two_branches()
    prepared = prepare(model, FLOAT16)
    with caplog.at_level(logging.WARNING):
        assert not warn_fp16_on_cpu(prepared)
        assert "can hide overflows" not in caplog.text
        assert warn_fp16_on_cpu(Converter(prepared, FLOAT16).convert([]))
    assert "checker.backend=fp16_emulation shows them" in caplog.text
