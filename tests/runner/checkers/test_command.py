"""The command checker: checks that say nothing about the model stop the run; the verdict is taken when the
check's main process exits; its processes die with the run; its output is capped in the log."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers.checks import reduce_args
from tests.helpers.cli import alive, check_cmd, one_line_error, start_process, write_script


@pytest.mark.parametrize(
    "code, words", [(127, ["exited 127", "not found"]), (126, ["exited 126", "cannot be executed"])]
)
def test_exit_126_and_127_stop_at_the_first_check(run, chain, code, words):
    r = run("mode=reduce", f"model={chain}", f"checker.cmd=\"bash -c 'echo oops; exit {code}'\"")
    one_line_error(r, *words, "oops", code=2)
    assert r.summary["checks"] == 1


KILLED = """
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_check_killed_by_a_signal(run, tmp_path):
    script = write_script(tmp_path / "oom.py", KILLED)
    r = run("mode=repeat", "until=3", check_cmd(script))
    one_line_error(r, "killed by SIGKILL", "out of memory?", "checker.signal_is=fail", code=2)
    r = run("mode=repeat", "until=3", check_cmd(script), "checker.signal_is=fail")
    assert r.returncode == 0 and r.summary["bad"] == 3
    assert r.replay["iterations"][0]["reason"] == "killed by SIGKILL (out of memory?)"


BACKGROUND_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(child.pid))
sys.exit(1)
"""


def test_background_child_does_not_delay_the_verdict(run, tmp_path):
    script = write_script(tmp_path / "bg.py", BACKGROUND_CHILD)
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    r = run("mode=repeat", "until=1", check_cmd(script, str(pid_file)), "checker.timeout_s=30")
    assert time.monotonic() - started < 30
    assert r.returncode == 0 and r.summary["bad"] == 1
    assert r.replay["iterations"][0]["reason"] == "exit code 1", "a false FAIL by timeout would say timeout"
    time.sleep(0.2)
    assert not alive(int(pid_file.read_text())), "the background child is ended with the check's process group"


def test_big_check_output_is_capped_in_the_log(run, tmp_path):
    script = write_script(
        tmp_path / "loud.py", "import sys\nsys.stdout.write('x' * 10_000_000 + '\\nLAST LINE\\n')\nsys.exit(1)\n"
    )
    r = run("mode=repeat", "until=1", check_cmd(script))
    assert r.returncode == 0
    log = (r.run_dir / "runner.log").read_text()
    assert len(log) < 50_000 and "LAST LINE" in log
    assert len(r.stdout) < 50_000
    whole = r.run_dir / "checks" / "iter1.log"
    assert whole.stat().st_size > 10_000_000 and "checks/iter1.log" in log


SLEEPER = """
import os, sys, time
open(sys.argv[1], "a").write(f"{os.getpid()}\\n")
time.sleep(60)
"""


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
@pytest.mark.slow
def test_signals_end_the_run_like_ctrl_c(tmp_path, sig, code):
    import signal as signal_module

    script = write_script(tmp_path / "sleeper.py", SLEEPER)
    pids = tmp_path / "pids.txt"
    run_dir = tmp_path / "run"
    proc = start_process(tmp_path, "mode=repeat", "until=3", check_cmd(script, str(pids)), run_dir=run_dir)
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(getattr(signal_module, sig))
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    time.sleep(0.2)
    assert not any(alive(int(p)) for p in pids.read_text().split())


@pytest.mark.slow
def test_check_dies_with_a_killed_runner(tmp_path):
    import signal as signal_module

    script = write_script(tmp_path / "sleeper.py", SLEEPER)
    pids = tmp_path / "pids.txt"
    proc = start_process(tmp_path, "mode=repeat", "until=3", check_cmd(script, str(pids)), run_dir=tmp_path / "run")
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal_module.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(alive(int(p)) for p in pids.read_text().split()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(int(p)) for p in pids.read_text().split())


@pytest.mark.slow
def test_closed_stdout_is_quiet(tmp_path, chain, has_nodes_script):
    cmd = [
        sys.executable,
        "-m",
        "runner",
        *reduce_args(chain, "n3", script=has_nodes_script),
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "Logging error" not in err, err[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "ok"


def test_an_unquoted_true_or_false_command_runs_that_program(run, chain):
    """Hydra reads checker.cmd=true as a boolean, which the schema makes "True": the program run is true."""
    r = run("mode=reduce", f"model={chain}", "checker.cmd=true")
    one_line_error(r, "passes on the unreduced model", "check command", code=2)
    assert "True" not in r.stderr


def test_the_original_passing_under_compare_names_its_tolerances(run, chain):
    r = run("mode=reduce", f"model={chain}", "checker=compare")
    line = one_line_error(r, "passes on the unreduced model", "checker.atol/rtol", code=2)
    assert "check command" not in line
