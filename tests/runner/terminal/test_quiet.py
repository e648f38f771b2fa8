"""quiet=1|2 and silent=true (Polygraphy's -q and --silent): less on the terminal, everything in runner.log."""

from __future__ import annotations

from tests.helpers.cli import one_line_error

CHECK = ["mode=reduce", "checker=python", "checker.target=tests.helpers.crashing.check"]


def test_quiet_levels_quiet_the_terminal_not_the_log(run, chain):
    loud = run(*CHECK, f"model={chain}")
    terminal = loud.stdout + loud.stderr
    assert loud.returncode == 0 and "Iteration 1:" in terminal and "nodes_after" in loud.stdout
    one = run(*CHECK, f"model={chain}", "quiet=1")
    terminal = one.stdout + one.stderr
    assert one.returncode == 0 and "Iteration 1:" not in terminal and "nodes_after" in one.stdout
    assert "Iteration 1:" in (one.run_dir / "runner.log").read_text()
    two = run(*CHECK, f"model={chain}", "quiet=2")
    assert two.returncode == 0 and two.stdout.strip() == "" and two.stderr.strip() == ""
    assert two.summary["reduced_nodes"] == loud.summary["reduced_nodes"]


def test_silent_prints_nothing_even_for_an_error(run, chain, tmp_path):
    r = run(*CHECK, f"model={chain}", "silent=true", f"inputs={tmp_path / 'missing.npz'}")
    assert r.returncode == 2 and r.stdout == "" and r.stderr == ""
    assert r.summary["status"].startswith("error:") and "missing.npz" in r.summary["status"]
    ok = run(*CHECK, f"model={chain}", "silent=true")
    assert ok.returncode == 0 and ok.stdout == "" and ok.stderr == ""


def test_bad_quiet_options(run, chain):
    one_line_error(run(*CHECK, f"model={chain}", "quiet=3"), "quiet=3", code=2)
    both = run(*CHECK, f"model={chain}", "quiet=1", "verbose=true")
    assert both.returncode == 2 and "error: verbose=true asks for more output" in both.stderr
