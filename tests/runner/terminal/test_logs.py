"""verbose=0|1|2, verbosity=, log_format= and log_file= (Polygraphy's -v/-vv, --verbosity, --log-format and
--log-file): through the run in-process and the CLI, and the settings' checks directly."""

from __future__ import annotations

import logging

import onnxruntime
import pytest

from runner.errors import ConfigError
from runner.terminal.logs import applied, settings
from tests.helpers.cli import one_line_error
from tests.helpers.models import chain_model

CHECK = ["mode=reduce", "checker=python", "checker.target=tests.helpers.crashing.check"]


def test_a_module_at_debug_and_the_rest_as_it_was(run, chain):
    plain = run(*CHECK, f"model={chain}")
    assert plain.returncode == 0 and "[DEBUG]" not in plain.stdout + plain.stderr
    one = run(*CHECK, f"model={chain}", "verbosity=[strategies/onnx_search.py:debug]")
    debug = [line for line in (one.stdout + one.stderr).splitlines() if "[DEBUG]" in line]
    assert one.returncode == 0 and debug, "the module's debug lines are shown"
    assert {line.split("][")[1] for line in debug} == {"strategies.onnx_search"}, "only that module's"
    assert logging.getLogger("strategies.onnx_search").level == logging.NOTSET, "its level is given back"
    every = run(*CHECK, f"model={chain}", "verbose=true")
    loggers = {line.split("][")[1] for line in (every.stdout + every.stderr).splitlines() if "[DEBUG]" in line}
    assert {"strategies.onnx_search", "statemachine.lifecycle"} <= loggers, "each check's key and times"


def test_one_level_for_the_run_in_polygraphys_names(run, chain):
    r = run(*CHECK, f"model={chain}", "verbosity=[WARNING]")
    assert r.returncode == 0 and "Iteration 1:" not in r.stdout + r.stderr
    assert "nodes_after" in r.stdout, "the result table is no log line"
    loud = run(*CHECK, f"model={chain}", "verbosity=[EXTRA_VERBOSE]")
    assert "[DEBUG]" in loud.stdout + loud.stderr


def test_the_format_drops_the_time_and_adds_the_line(run, chain):
    r = run(*CHECK, f"model={chain}", "log_format=[line-info,no-colors]")
    line = next(line for line in r.stdout.splitlines() if "Iteration 1:" in line)
    assert line.startswith("[strategies.") or line.startswith("[statemachine."), "no time first"
    assert ".py:" in line.split(" - ")[0], "file and line before the message"
    assert "Iteration 1:" in (r.run_dir / "runner.log").read_text(), "runner.log keeps every line"


def test_log_file_gets_every_line_and_follows_the_output_rule(run, chain, tmp_path):
    mine = tmp_path / "notes.log"
    mine.write_text("a file of the user's\n")
    r = run(*CHECK, f"model={chain}", f"log_file={mine}")
    assert r.returncode == 0 and mine.read_text() == "a file of the user's\n", "never replaced"
    written = tmp_path / "notes_1.log"
    assert "Iteration 1:" in written.read_text() and "notes_1.log" in r.stdout + r.stderr
    again = run(*CHECK, f"model={chain}", f"log_file={written}")
    assert again.returncode == 0 and not (tmp_path / "notes_2.log").exists(), "the run's own file is replaced"
    one_line_error(run(*CHECK, f"model={chain}", f"log_file={chain}"), "log_file=", code=2)


def test_bad_log_keys_are_one_line(run, run_cli, chain):
    one_line_error(run(*CHECK, f"model={chain}", "verbosity=[no_such_module:debug]"), "no module", code=2)
    one_line_error(run(*CHECK, f"model={chain}", "verbosity=[runner:loud]"), "is no level", code=2)
    one_line_error(run(*CHECK, f"model={chain}", "log_format=[colors]"), "log_format=colors", code=2)
    one_line_error(run_cli(*CHECK, f"model={chain}", "verbose=3"), "verbose=3", code=2)


def test_verbose_two_opens_onnx_runtimes_own_log_and_closes_it(capfd):
    assert settings(verbose=True).verbose == 1 and settings(verbose=False).verbose == 0
    model = chain_model(2).SerializeToString()
    root = logging.getLogger()
    before = root.level
    capfd.readouterr()
    with applied(settings(verbose=2)):
        assert root.level == logging.DEBUG
        onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        assert "onnxruntime" in capfd.readouterr().err, "ONNX Runtime's verbose lines"
    onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert capfd.readouterr().err == "" and root.level == before


@pytest.mark.parametrize(
    "entries, want",
    [
        (["debug"], {"": logging.DEBUG}),
        (["runner/lowp/convert.py:warning"], {"runner.lowp.convert": logging.WARNING}),
        (["strategies.precision:verbose", "onnx:error"], {"strategies.precision": 10, "onnx": 40}),
    ],
)
def test_verbosity_entries(entries, want):
    assert settings(verbosity=entries).levels == want


def test_a_lone_string_is_one_entry_and_nonsense_is_refused():
    assert settings(verbosity="info").levels == {"": logging.INFO}
    with pytest.raises(ConfigError, match="give one of"):
        settings(verbosity=["runner:"])
