"""Functions named by a dotted path (``runner.targets.locate``): each failure is one line naming what is missing."""

from __future__ import annotations

import json
import sys

import pytest

from runner.errors import CheckStartError
from runner.targets import locate


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """``good_mod`` (a function and a class), ``needs_missing`` (imports a module that is not there) and
    ``raises_on_import`` on ``sys.path``."""
    (tmp_path / "good_mod.py").write_text(
        "def check(path):\n    return True\n\nclass C:\n    def m(self):\n        pass\n"
    )
    (tmp_path / "needs_missing.py").write_text("import no_such_dependency_here\n")
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('no license file\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("good_mod", "needs_missing", "raises_on_import"):
        sys.modules.pop(name, None)


def test_a_module_function_a_method_and_a_package_function_are_found(modules):
    assert locate("good_mod.check", "checker.target", CheckStartError)("x") is True
    assert locate("good_mod.C.m", "checker.target", CheckStartError).__name__ == "m"
    assert locate("json.decoder.JSONDecoder", "checker.target", CheckStartError) is json.decoder.JSONDecoder


@pytest.mark.parametrize(
    "target, words",
    [
        ("nodots", "checker.target='nodots' is not module.function"),
        ("good_mod.", "is not module.function"),
        ("no_such_module_here.fn", "cannot import no_such_module_here (no module named 'no_such_module_here')"),
        ("good_mod.nope", "checker.target=good_mod.nope: good_mod has no nope"),
        ("json.decoder.nope", "json.decoder has no nope"),
        ("needs_missing.fn", "cannot import needs_missing (No module named 'no_such_dependency_here')"),
        ("raises_on_import.fn", "importing raises_on_import raises RuntimeError: no license file"),
    ],
)
def test_each_failure_is_one_line_naming_what_is_missing(modules, target, words):
    with pytest.raises(CheckStartError) as e:
        locate(target, "checker.target", CheckStartError)
    assert words in str(e.value) and "\n" not in str(e.value)
