"""mode=repeat through the real CLI: checker options, until forms, artifact sorting, timeouts, resume."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import check_cmd, replay_iterations, start_process, wait_for, write_script

# Fails on the runs whose numbers are given on the command line; writes out.txt each run.
FLAKY = """
import os, sys
n = int(os.environ["RUNNER_ITERATION"])
open("out.txt", "w").write(f"run {n}\\n")
print(f"run {n} says hello")
sys.exit(1 if str(n) in sys.argv[1:] else 0)
"""

EXIT_WITH = """
import sys
print(sys.argv[2] if len(sys.argv) > 2 else "")
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def flaky(tmp_path):
    return write_script(tmp_path / "flaky.py", FLAKY)


@pytest.fixture
def exit_with(tmp_path):
    return write_script(tmp_path / "exit_with.py", EXIT_WITH)


@pytest.mark.parametrize(
    "until, fails, expected_runs", [("bad", "3", 3), ("good", "1 2", 3), ("4", "2", 4), ("1", "", 1)]
)
@pytest.mark.slow
def test_until_forms(run, flaky, until, fails, expected_runs):
    r = run("mode=repeat", f"until={until}", check_cmd(flaky, *fails.split()))
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert s["status"] == "ok"
    assert s["iterations"] == s["checks"] == s["runs"] == expected_runs
    assert s["bad"] == len([f for f in fails.split() if int(f) <= expected_runs])
    assert [e["passed"] for e in r.replay["iterations"]] == [
        str(i) not in fails.split() for i in range(1, expected_runs + 1)
    ]


def test_artifacts_sorted_into_good_and_bad(run, flaky, tmp_path):
    art = tmp_path / "sorted"
    r = run("mode=repeat", "until=4", check_cmd(flaky, "2", "4"), "artifacts.paths=[out.txt]", f"artifacts.dir={art}")
    assert r.returncode == 0, r.stderr
    good = sorted(p.name for p in (art / "good").iterdir())
    bad = sorted(p.name for p in (art / "bad").iterdir())
    assert [n.split("_")[1] for n in good] == ["iter1", "iter3"]
    assert [n.split("_")[1] for n in bad] == ["iter2", "iter4"]
    assert all(n.startswith("out_iter") and n.endswith(".txt") for n in good + bad)
    assert all("_rc0" in n for n in good) and all("_rc1" in n for n in bad)
    assert (art / "bad" / bad[0]).read_text() == "run 2\n"
    assert not (tmp_path / "out.txt").exists(), "artifacts are moved, not copied"


def test_sorting_never_overwrites(run, flaky, tmp_path):
    art = tmp_path / "sorted"
    for _ in range(2):
        r = run("mode=repeat", "until=1", check_cmd(flaky), "artifacts.paths=[out.txt]", f"artifacts.dir={art}")
        assert r.returncode == 0, r.stderr
    kept = list((art / "good").iterdir())
    assert len(kept) == 2, kept


def test_missing_artifact_is_a_warning(run, exit_with, tmp_path):
    r = run(
        "mode=repeat",
        "until=1",
        check_cmd(exit_with, "0"),
        "artifacts.paths=[never_made.bin]",
        f"artifacts.dir={tmp_path / 'a'}",
    )
    assert r.returncode == 0
    assert "never_made.bin was not produced" in r.stdout


def test_inputs_a_command_check_never_reads_are_warned_of(run, exit_with, tmp_path, chain):
    """inputs= and data_loader= feed only checker=compare; a repeat of a command check used to take them silently
    (even a data_loader= that cannot be imported)."""
    r = run("mode=repeat", "until=1", f"model={chain}", check_cmd(exit_with, "0"), "data_loader=no_such_module.fn")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "data_loader= not read: mode=repeat hands the check the model as it is" in r.stdout
    compared = run("mode=repeat", "until=1", f"model={chain}", "checker=compare", "data_loader=no_such_module.fn")
    assert compared.returncode == 2 and "data_loader=no_such_module.fn: cannot import" in compared.stderr


def test_iter_info_written_each_iteration(run, tmp_path):
    script = write_script(
        tmp_path / "read_info.py",
        "import json,os,sys\nd=json.load(open(sys.argv[1]))\n"
        'sys.exit(0 if d["iteration"]==int(os.environ["RUNNER_ITERATION"]) else 1)\n',
    )
    info = tmp_path / "info.json"
    r = run("mode=repeat", "until=3", check_cmd(script, str(info)), f"artifacts.iter_info={info}")
    assert r.returncode == 0, r.stderr
    assert r.summary["good"] == 3, "the check read its own iteration's info"
    assert not info.exists(), "removed once each iteration has its verdict, as Polygraphy does"


@pytest.mark.parametrize(
    "code, option, passed",
    [
        (3, "checker.fail_codes=[2]", True),
        (3, "checker.fail_codes=[3]", False),
        (3, "checker.ignore_fail_codes=[3]", True),
        (4, "checker.ignore_fail_codes=[3]", False),
        (0, "checker.fail_codes=[0]", False),
    ],
)
def test_fail_codes(run, exit_with, code, option, passed):
    r = run("mode=repeat", "until=1", check_cmd(exit_with, str(code)), option)
    assert r.returncode == 0, r.stderr
    assert r.replay["iterations"][0]["passed"] is passed
    assert r.replay["iterations"][0]["returncode"] == code


@pytest.mark.parametrize(
    "code, text, extra, passed",
    [
        (0, "CRASH", [], False),  # a regex match fails even with exit code 0
        (1, "fine", [], True),  # no match passes even with exit code 1
        (1, "CRASH", ["checker.fail_codes=[2]"], True),  # both must agree
        (2, "CRASH", ["checker.fail_codes=[2]"], False),
    ],
)
def test_fail_regex(run, exit_with, code, text, extra, passed):
    r = run("mode=repeat", "until=1", check_cmd(exit_with, str(code), text), "checker.fail_regex=[CRA.H]", *extra)
    assert r.returncode == 0, r.stderr
    assert r.replay["iterations"][0]["passed"] is passed


@pytest.mark.slow
def test_show_output_and_hide_fail_output(run, exit_with):
    quiet = run("mode=repeat", "until=1", check_cmd(exit_with, "0", "passing-words"))
    assert "passing-words" not in quiet.stdout
    shown = run("mode=repeat", "until=1", check_cmd(exit_with, "0", "passing-words"), "checker.show_output=true")
    assert "passing-words" in shown.stdout
    failing = run("mode=repeat", "until=1", check_cmd(exit_with, "1", "failing-words"))
    assert "failing-words" in failing.stdout
    hidden = run("mode=repeat", "until=1", check_cmd(exit_with, "1", "failing-words"), "checker.hide_fail_output=true")
    assert "failing-words" not in hidden.stdout


@pytest.mark.slow
def test_timeout_kills_process_group(run, tmp_path):
    pidfile = tmp_path / "child.pid"
    script = write_script(
        tmp_path / "hang.py",
        f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open({str(pidfile)!r}, "w").write(str(child.pid))
time.sleep(60)
""",
    )
    start = time.monotonic()
    r = run("mode=repeat", "until=1", check_cmd(script), "checker.timeout_s=1.5")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - start < 30
    entry = r.replay["iterations"][0]
    assert entry["passed"] is False and entry["reason"].startswith("timeout")
    assert "timed out" in r.stdout
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    status = Path(f"/proc/{pid}/status")
    # gone, or a zombie waiting for a reaper that this container may not run
    assert not status.exists() or "State:\tZ" in status.read_text()


def test_env_and_placeholder(run, tmp_path):
    script = write_script(
        tmp_path / "env.py",
        "import os,sys\n"
        'sys.exit(0 if sys.argv[1]==os.environ["RUNNER_ARTIFACT"] and sys.argv[1].endswith("it.bin") else 1)\n',
    )
    r = run("mode=repeat", "until=1", check_cmd(script, "{artifact}"), f"artifacts.iter_artifact={tmp_path / 'it.bin'}")
    assert r.replay["iterations"][0]["passed"] is True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_kill_then_resume(run, tmp_path, sig):
    """A run stopped mid-way and resumed with its replay ends like an uninterrupted run, with fewer checks."""
    script = write_script(
        tmp_path / "slow.py",
        'import os,sys,time\ntime.sleep(0.15)\nsys.exit(1 if os.environ["RUNNER_ITERATION"] in ("5",) else 0)\n',
    )
    full = run("mode=repeat", "until=bad", check_cmd(script))
    assert full.summary["runs"] == 5 and full.summary["checks"] == 5

    first_dir = tmp_path / "interrupted"
    proc = start_process(tmp_path, "mode=repeat", "until=bad", check_cmd(script), run_dir=first_dir)
    wait_for(lambda: replay_iterations(first_dir / "replay.json") >= 2, proc)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    done = len(json.loads((first_dir / "replay.json").read_text())["iterations"])
    assert 2 <= done < 5
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert json.loads((first_dir / "summary.json").read_text())["status"] == "interrupted"

    resumed = run("mode=repeat", "until=bad", check_cmd(script), f"replay.load={first_dir / 'replay.json'}")
    assert resumed.returncode == 0, resumed.stderr
    s = resumed.summary
    assert s["runs"] == 5 and s["bad"] == 1
    assert s["checks"] == 5 - done and s["reused"] == done
    assert [e["passed"] for e in resumed.replay["iterations"]] == [e["passed"] for e in full.replay["iterations"]]


@pytest.mark.slow
def test_interactive_asks_on_a_terminal(tmp_path):
    import pty

    master, slave = pty.openpty()
    cmd = [
        sys.executable,
        "-m",
        "runner",
        "mode=repeat",
        "until=bad",
        "checker=interactive",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdin=slave, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    seen = b""
    answers = [b"maybe\n", b"y\n", b"n\n"]
    end = time.monotonic() + 60
    while answers and time.monotonic() < end:
        if not select.select([master], [], [], 1.0)[0]:
            continue
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        seen += chunk
        while answers and seen.count(b"? [y/n]") > 3 - len(answers):
            os.write(master, answers.pop(0))
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
        os.close(master)
    assert b"Did iteration 1 pass" in seen and b"Did iteration 2 pass" in seen
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert proc.returncode == 0 and summary["runs"] == 2 and summary["bad"] == 1


@pytest.mark.slow
def test_interactive_answers_can_be_piped(tmp_path):
    """As Polygraphy reads them: one line per question from a pipe; running out of answers is one line."""
    cmd = [sys.executable, "-m", "runner", "mode=repeat", "until=bad", "checker=interactive"]
    piped = subprocess.run(
        [*cmd, f"hydra.run.dir={tmp_path / 'piped'}"],
        cwd=tmp_path,
        input="maybe\ny\nn\n",
        capture_output=True,
        text=True,
    )
    assert piped.returncode == 0, piped.stderr[-2000:]
    summary = json.loads((tmp_path / "piped" / "summary.json").read_text())
    assert summary["runs"] == 2 and summary["good"] == 1 and summary["bad"] == 1
    assert "Did iteration 2 pass" in piped.stdout
    short = subprocess.run(
        [*cmd, f"hydra.run.dir={tmp_path / 'short'}"], cwd=tmp_path, input="y\n", capture_output=True, text=True
    )
    errors = [line for line in short.stderr.splitlines() if line.startswith("error: ")]
    assert short.returncode == 2 and len(errors) == 1 and "standard input ended" in errors[0]
    assert "Traceback" not in short.stderr


@pytest.mark.slow
def test_rerun_from_config_snapshot(run_cli, flaky, tmp_path):
    first = run_cli("mode=repeat", "until=3", check_cmd(flaky, "2"))
    snapshot = first.run_dir / ".hydra"
    assert (snapshot / "config.yaml").is_file()
    # a relative --config-path means the directory the user sees, not one inside the package
    again = run_cli("--config-path", str(snapshot.relative_to(tmp_path)), "--config-name", "config", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.run_dir != first.run_dir
    assert [e["passed"] for e in again.replay["iterations"]] == [e["passed"] for e in first.replay["iterations"]]
    assert again.summary["runs"] == 3 and again.summary["bad"] == 1


@pytest.mark.slow  # the classifier on ONNX's reference evaluator, four times: 1.2-1.9 s
def test_repeat_compare_checks_a_backend_run_after_run(run, tmp_path):
    from tests.helpers.models import CLASSIFIER, need

    r = run(
        "mode=repeat",
        "until=3",
        f"model={need(CLASSIFIER)}",
        "checker=compare",
        "checker.backend=onnx_reference",
        "model_input_shapes={x:[1,3,48,192]}",
    )
    assert r.returncode == 0, r.stderr
    assert r.summary["good"] == 3
    assert all("outputs" in e["details"] for e in r.replay["iterations"])


def test_moving_the_replay_keeps_the_iteration_artifact_in_the_run_dir(run, tmp_path):
    script = write_script(
        tmp_path / "where.py",
        'import os,sys\nsys.exit(0 if os.path.dirname(os.environ["RUNNER_ARTIFACT"]) == sys.argv[1] else 1)\n',
    )
    run_dir = tmp_path / "the_run"
    r = run(
        "mode=repeat",
        "until=1",
        check_cmd(script, str(run_dir)),
        f"replay.save={tmp_path / 'elsewhere' / 'replay.json'}",
        run_dir=run_dir,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "elsewhere" / "replay.json").is_file()
    assert json.loads((tmp_path / "elsewhere" / "replay.json").read_text())["iterations"][0]["passed"] is True
