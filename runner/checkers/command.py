"""The command checker: run a user's command per iteration; its exit code and output decide."""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Tuple

from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker, conf_of
from runner.checkers.polygraphy_check import polygraphy_run_outputs
from runner.config import CommandCheckerConf, seconds_limit
from runner.errors import CheckError, CheckStartError, ConfigError
from runner.executors.slot import CheckCancelled, Slot
from runner.files.artifacts import unique_path
from runner.write_guard import check_write

log = logging.getLogger(__name__)


class CommandChecker(Checker):
    """Runs ``cmd`` (split with shlex, no shell) and judges it as Polygraphy's ``--check`` does.

    ``{artifact}`` in any argument is replaced by the iteration artifact's path, which is also in
    the environment as ``RUNNER_ARTIFACT`` (and the iteration number as ``RUNNER_ITERATION``).
    ``{worker}`` is replaced by the check's worker slot (``RUNNER_WORKER``; 0 in a serial run), so
    checks that run at once can write files of their own; ``executor.gpus`` sets
    ``CUDA_VISIBLE_DEVICES``.

    Verdict rules (Polygraphy's): an exit code in ``ignore_fail_codes`` passes. With
    ``fail_codes``, only those codes fail (and, with ``fail_regex`` too, only when the output
    also matches). Without ``fail_codes``, ``fail_regex`` alone decides when given (a match
    fails, even with exit code 0), else any non-zero exit code fails. A check running longer
    than ``timeout_s`` seconds is killed with its whole process group and fails.

    Checks that say nothing about the candidate stop the run instead of counting: exit code 126
    or 127 (a program cannot be executed or is not found, unless listed in ``fail_codes`` or
    ``ignore_fail_codes``), and death by a signal (an out-of-memory kill is SIGKILL) unless
    ``signal_is="fail"``.

    Args:
        conf: the checker's schema, ``runner.config.CommandCheckerConf`` (``CommandChecker.of(cmd, **keys)``
            fills it), whose keys mean:

    Keys:
        cmd: the command line, e.g. ``"python check.py {artifact}"``.
        fail_codes: exit codes that count as failures; any other passes.
        ignore_fail_codes: exit codes never counted as failures (exclusive with ``fail_codes``).
        fail_regex: regular expressions searched in stdout + stderr.
        show_output: log the command's output for passing checks too.
        hide_fail_output: do not log the output of failing checks.
        timeout_s: seconds before the check is killed; None waits forever.
        signal_is: what a check killed by a signal counts as: "error" (stop the run) or "fail".

    Raises:
        ConfigError: empty command, bad regex, both code lists, a non-positive timeout.
        CheckStartError: the command's program is not found or not executable.
    """

    in_process = False
    verdict_by_bytes = True

    schema = CommandCheckerConf

    def __init__(self, conf: CommandCheckerConf):
        cmd, fail_codes, ignore_fail_codes, fail_regex = (
            conf.cmd,
            conf.fail_codes,
            conf.ignore_fail_codes,
            conf.fail_regex,
        )
        show_output, hide_fail_output, timeout_s = conf.show_output, conf.hide_fail_output, conf.timeout_s
        signal_is = conf.signal_is
        if cmd in ("True", "False"):  # Hydra read an unquoted checker.cmd=true/false as a boolean
            cmd = cmd.lower()
        try:
            self.argv = shlex.split(cmd or "")
        except ValueError as e:
            raise ConfigError(f"checker.cmd={cmd!r} cannot be split into arguments ({e}); fix its quoting") from None
        if not self.argv:
            raise ConfigError("checker.cmd is empty; set 'checker.cmd=\"python check.py {artifact}\"'")
        if fail_codes and ignore_fail_codes:
            raise ConfigError("checker.fail_codes and checker.ignore_fail_codes exclude each other; set only one")
        self.signal_is = signal_is.value  # runner.config.SignalIs: "error" or "fail"
        timeout_s = seconds_limit(timeout_s, "checker.timeout_s")
        try:
            self.fail_regex = [re.compile(r) for r in fail_regex] if fail_regex else None
        except re.error as e:
            raise ConfigError(f"checker.fail_regex has an invalid regular expression ({e}); fix the pattern") from None
        self.fail_codes = list(fail_codes) if fail_codes else None
        self.ignore_fail_codes = list(ignore_fail_codes) if ignore_fail_codes else None
        self.show_output = show_output
        self.hide_fail_output = hide_fail_output
        self.timeout_s = timeout_s
        #: the folder the run started in: the command runs there wherever its check runs (a Dask worker started in
        #: another folder), so the paths it names relative to it resolve as they did when the user typed them
        self.cwd = os.getcwd()
        program = self.argv[0]
        if shutil.which(program) is None:
            raise CheckStartError(
                f"check command program {program!r} is not found or not executable; "
                "fix checker.cmd (use a full path or a program on PATH)"
            )

    @classmethod
    def of(cls, cmd: str, **keys: Any) -> CommandChecker:
        """A checker of ``cmd`` and the schema's other ``keys``, the rest at their one default
        (``runner.checkers.base.conf_of``).

        Raises:
            ConfigError, CheckStartError: as the constructor.
        """
        return cls(conf_of(CommandCheckerConf, {"cmd": cmd, **keys}))

    @property
    def names_artifact(self) -> bool:
        """Whether the command names ``{artifact}`` (it may still read ``$RUNNER_ARTIFACT``)."""
        return any("{artifact}" in word for word in self.argv)

    def compared_tensors(self) -> Optional[Tuple[str, ...]]:
        """The tensors of a ``polygraphy run ... --load-outputs FILE`` check's golden file
        (``runner.checkers.polygraphy_check``); None for any other command."""
        return polygraphy_run_outputs(self.argv)

    def _failed(self, returncode: int, output: str) -> bool:
        if self.ignore_fail_codes and returncode in self.ignore_fail_codes:
            return False
        matched = None
        if self.fail_regex is not None:
            matched = any(r.search(output) for r in self.fail_regex)
        if self.fail_codes is not None:
            failed = returncode in self.fail_codes
            return failed and matched if matched is not None else failed
        return returncode != 0 if matched is None else matched

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Run the command once; see the class docstring for how the verdict is decided.

        The verdict is taken when the command's main process exits: its output goes to a file
        (``<output_dir>/iter<N>.log``), not a pipe, so a background child holding the output
        does not delay it, and such children are then ended with the command's process group.

        Raises:
            CheckStartError: the program vanished or cannot be executed (exit code 126 or 127).
            CheckError: the command was killed by a signal and ``signal_is`` is "error".
            KeyboardInterrupt: re-raised after killing the command's process group.
        """
        path = str(artifact) if artifact is not None else ""
        worker = str(slot.worker) if slot is not None else "0"
        argv = substitute(self.argv, path, worker)
        env = dict(os.environ, RUNNER_ARTIFACT=path, RUNNER_ITERATION=str(iteration), RUNNER_WORKER=worker)
        if slot is not None:
            env.update(slot.env())
        log.debug("Running check: %s", shlex.join(argv))
        if not os.path.isdir(self.cwd):
            raise CheckStartError(
                f"the check runs in {self.cwd}, where the run started, and the machine running it "
                f"({socket.gethostname()}) has no such folder; share that folder with the workers, or give the "
                "command absolute paths they can read"
            )
        with _output_file(self.output_dir, iteration) as (out, out_path):
            try:
                proc = subprocess.Popen(
                    _with_reaper(argv),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    cwd=self.cwd,
                )
            except OSError as e:
                raise CheckStartError(
                    f"cannot start check command {argv[0]!r} ({e.strerror}); fix checker.cmd"
                ) from None
            timed_out = False
            try:
                timed_out = not _wait(proc, self.timeout_s, slot)
                if timed_out:
                    _kill_group(proc)
                    proc.wait()
            except BaseException:
                _kill_group(proc)
                proc.wait()
                raise
            _kill_group(proc)  # background children the command left behind
            output = _read_output(out, whole=self.fail_regex is not None)
        code = proc.returncode
        where = f" (whole output: {out_path})" if out_path else ""
        if timed_out:
            log.warning("Check of iteration %d timed out after %s s; counted as a failure", iteration, self.timeout_s)
            verdict = Verdict(False, code, f"timeout after {self.timeout_s} s", timeout=True)
        elif code < 0:
            verdict = self._killed(-code, iteration, output)
        elif code in (126, 127) and code not in (self.fail_codes or []) + (self.ignore_fail_codes or []):
            why = "cannot be executed" if code == 126 else "was not found"
            raise CheckStartError(
                f"check command exited {code} in iteration {iteration}: a program it runs {why} "
                f"({_last_line(output) or 'no output'}); fix checker.cmd"
            )
        elif self._failed(code, output):
            verdict = Verdict(False, code, f"exit code {code}")
        else:
            verdict = Verdict(True, code, f"exit code {code}")
        verdict.output_tail = tail(output, TAIL_CHARS)
        if out_path:
            verdict.output_file = str(out_path)
        if output.strip() and (
            (verdict.passed and self.show_output) or (not verdict.passed and not self.hide_fail_output)
        ):
            log.info("Check output of iteration %d%s:\n%s", iteration, where, tail(output, LOG_CHARS).rstrip())
        return verdict

    def _killed(self, signum: int, iteration: int, output: str) -> Verdict:
        name = _signal_name(signum)
        hint = SIGNAL_HINTS.get(signum, "")
        what = f"killed by {name}{f' ({hint})' if hint else ''}"
        if self.signal_is == "error":
            raise CheckError(
                f"the check of iteration {iteration} was {what}, which says nothing about the model; "
                "fix the check or its resources, or count it as a failure with checker.signal_is=fail"
            )
        log.warning("Check of iteration %d was %s; counted as a failure (checker.signal_is=fail)", iteration, what)
        return Verdict(False, -signum, what, {"signal": name})


#: characters of a check's output kept in the log and in the verdict (the whole output stays in its file)
LOG_CHARS = 4000
TAIL_CHARS = 1000

#: what a signal that ended a check most likely means
SIGNAL_HINTS: Dict[int, str] = {
    signal.SIGKILL: "out of memory?",
    signal.SIGSEGV: "the check crashed",
    signal.SIGABRT: "the check aborted",
    signal.SIGBUS: "the check crashed",
}

_REAPER = Path(__file__).with_name("reaper.py")


#: programs whose ``-c`` argument is a shell script: paths substituted into it are quoted for the shell
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "busybox", "fish", "csh", "tcsh"})


def _shell_at(argv: List[str]) -> int:
    """Where a shell program is in ``argv``, or -1: the first word named ``sh``, ``bash``, ... wherever
    it stands, so that any program that runs the rest of its words as a command (``env -u HOME``,
    ``timeout -s KILL 60``, ``stdbuf -o L``, ``flock FILE``, ``xargs -a FILE``, and ones no list
    holds) puts no path into a shell script unquoted."""
    return next((i for i, word in enumerate(argv) if Path(word).name in SHELLS), -1)


def substitute(argv: List[str], artifact: str, worker: str) -> List[str]:
    """``argv`` with ``{artifact}`` and ``{worker}`` filled in. The command runs without a shell, so a
    path goes in as it is, except into the script of ``sh -c SCRIPT`` (or bash, zsh, ..., with any
    flags, behind any program that runs it: ``env``, ``timeout -s KILL 60``, ``flock FILE``,
    ``xargs``...), where it is quoted (``shlex.quote``): a folder named ``$(rm -rf ~)`` stays a name
    there too.

    Args:
        argv: the command's words (``shlex.split`` of ``checker.cmd``).
        artifact: the iteration artifact's path. worker: the worker slot's number.
    """
    script_at = -1
    shell = _shell_at(argv)
    if shell >= 0:
        for i, word in enumerate(argv[shell + 1 : -1], start=shell + 1):
            if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
                script_at = i + 1
                break
    out = []
    for i, word in enumerate(argv):
        if i == script_at:  # the user's own quotes around it give way to safe ones
            quoted = shlex.quote(artifact)
            for own in ('"{artifact}"', "'{artifact}'"):
                word = word.replace(own, quoted)
            word = word.replace("{artifact}", quoted)
        out.append(word.replace("{artifact}", artifact).replace("{worker}", worker))
    return out


def _with_reaper(argv: List[str]) -> List[str]:
    """On Linux, start the command through the reaper, so its process group dies with the runner."""
    if sys.platform.startswith("linux"):
        return [sys.executable, "-I", "-S", str(_REAPER), str(os.getpid()), *argv]
    return argv


@contextmanager
def _output_file(directory: Optional[Path], iteration: int) -> Iterator[Tuple[BinaryIO, Optional[Path]]]:
    """The file a check writes its output to: ``directory/iter<N>.log``, or an anonymous temp file."""
    if directory is None:
        with tempfile.TemporaryFile() as f:
            yield f, None
        return
    directory.mkdir(parents=True, exist_ok=True)
    path = unique_path(directory / f"iter{iteration}.log")
    check_write(path, f"check {iteration}'s output")
    with open(path, "w+b") as f:
        yield f, path


def _read_output(f: BinaryIO, whole: bool) -> str:
    """The check's output: all of it when a regex must see it, else the last ``LOG_CHARS`` bytes."""
    f.flush()
    size = f.seek(0, os.SEEK_END)
    f.seek(0 if whole else max(size - LOG_CHARS, 0))
    return f.read().decode(errors="replace")


def tail(text: str, chars: int) -> str:
    """The last ``chars`` characters of ``text``, starting at a line, marked when cut."""
    if len(text) <= chars:
        return text
    cut = text[-chars:]
    return "[...]\n" + cut[cut.find("\n") + 1 :] if "\n" in cut else "[...]" + cut


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _wait(proc: subprocess.Popen[bytes], timeout_s: Optional[float], slot: Optional[Slot]) -> bool:
    """Wait for the check's process: True when it exited, False after ``timeout_s`` seconds.

    Raises:
        CheckCancelled: the slot was cancelled while it ran (the caller kills the process group).
    """
    if slot is None or slot.cancel is None:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        step = slot.poll_s if deadline is None else max(min(slot.poll_s, deadline - time.monotonic()), 0.0)
        try:
            proc.wait(timeout=step)
            return True
        except subprocess.TimeoutExpired:
            pass
        if slot.cancelled():
            raise CheckCancelled(f"check process {proc.pid} cancelled")
        if deadline is not None and time.monotonic() >= deadline:
            return False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill every process left in the check's process group (it leads its own session)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
