"""The command checker: run a user's command per iteration; its exit code and output decide."""
from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path
from typing import List, Optional

from runner.checkers.base import Checker
from runner.errors import CheckStartError, ConfigError
from strategies.base import Candidate, Verdict

log = logging.getLogger(__name__)


class CommandChecker(Checker):
    """Runs ``cmd`` (split with shlex, no shell) and judges it as Polygraphy's ``--check`` does.

    ``{artifact}`` in any argument is replaced by the iteration artifact's path, which is also in
    the environment as ``RUNNER_ARTIFACT`` (and the iteration number as ``RUNNER_ITERATION``).

    Verdict rules (Polygraphy's): an exit code in ``ignore_fail_codes`` passes. With
    ``fail_codes``, only those codes fail (and, with ``fail_regex`` too, only when the output
    also matches). Without ``fail_codes``, ``fail_regex`` alone decides when given (a match
    fails, even with exit code 0), else any non-zero exit code fails. A check running longer
    than ``timeout_s`` seconds is killed with its whole process group and fails.

    Args:
        cmd: the command line, e.g. ``"python check.py {artifact}"``.
        fail_codes: exit codes that count as failures; any other passes.
        ignore_fail_codes: exit codes never counted as failures (exclusive with ``fail_codes``).
        fail_regex: regular expressions searched in stdout + stderr.
        show_output: log the command's output for passing checks too.
        hide_fail_output: do not log the output of failing checks.
        timeout_s: seconds before the check is killed; None waits forever.

    Raises:
        ConfigError: empty command, bad regex, both code lists, a non-positive timeout.
        CheckStartError: the command's program is not found or not executable.
    """

    def __init__(
        self,
        cmd: str,
        fail_codes: Optional[List[int]] = None,
        ignore_fail_codes: Optional[List[int]] = None,
        fail_regex: Optional[List[str]] = None,
        show_output: bool = False,
        hide_fail_output: bool = False,
        timeout_s: Optional[float] = None,
    ):
        try:
            self.argv = shlex.split(cmd or "")
        except ValueError as e:
            raise ConfigError(f"checker.cmd={cmd!r} cannot be split into arguments ({e}); fix its quoting") from None
        if not self.argv:
            raise ConfigError("checker.cmd is empty; set 'checker.cmd=\"python check.py {artifact}\"'")
        if fail_codes and ignore_fail_codes:
            raise ConfigError("checker.fail_codes and checker.ignore_fail_codes exclude each other; set only one")
        if timeout_s is not None and timeout_s <= 0:
            raise ConfigError(f"checker.timeout_s={timeout_s} must be a positive number of seconds")
        try:
            self.fail_regex = [re.compile(r) for r in fail_regex] if fail_regex else None
        except re.error as e:
            raise ConfigError(f"checker.fail_regex has an invalid regular expression ({e}); fix the pattern") from None
        self.fail_codes = list(fail_codes) if fail_codes else None
        self.ignore_fail_codes = list(ignore_fail_codes) if ignore_fail_codes else None
        self.show_output = show_output
        self.hide_fail_output = hide_fail_output
        self.timeout_s = timeout_s
        program = self.argv[0]
        if shutil.which(program) is None:
            raise CheckStartError(
                f"check command program {program!r} is not found or not executable; "
                "fix checker.cmd (use a full path or a program on PATH)"
            )

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

    def check(self, artifact: Optional[Path], iteration: int, candidate: Candidate) -> Verdict:
        """Run the command once; see the class docstring for how the verdict is decided.

        Raises:
            CheckStartError: the program vanished or cannot be executed.
            KeyboardInterrupt: re-raised after killing the command's process group.
        """
        path = str(artifact) if artifact is not None else ""
        argv = [a.replace("{artifact}", path) for a in self.argv]
        env = dict(os.environ, RUNNER_ARTIFACT=path, RUNNER_ITERATION=str(iteration))
        log.debug("Running check: %s", shlex.join(argv))
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        except OSError as e:
            raise CheckStartError(f"cannot start check command {argv[0]!r} ({e.strerror}); fix checker.cmd") from None
        timed_out = False
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        output = out.decode(errors="replace") + err.decode(errors="replace")
        if timed_out:
            log.warning("Check of iteration %d timed out after %s s; counted as a failure", iteration, self.timeout_s)
            verdict = Verdict(False, proc.returncode, f"timeout after {self.timeout_s} s", {"timeout": True})
        elif self._failed(proc.returncode, output):
            verdict = Verdict(False, proc.returncode, f"exit code {proc.returncode}")
        else:
            verdict = Verdict(True, proc.returncode, f"exit code {proc.returncode}")
        if output.strip() and ((verdict.passed and self.show_output) or (not verdict.passed and not self.hide_fail_output)):
            log.info("Check output (iteration %d):\n%s", iteration, output.rstrip())
        return verdict


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the check and every process it started (it leads its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
