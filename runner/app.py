"""One run: build the strategy, checker and lifecycle from the config, run it, write the summary."""
from __future__ import annotations

import logging
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.utils import get_method, instantiate
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from runner.artifacts import ArtifactSorter
from runner.checkers.base import Checker
from runner.errors import ConfigError, RunnerError
from runner.jsonio import write_json_atomic
from runner.paths import run_dir
from runner.progress import Progress
from runner.replay import Replay
from runner.report import print_table
from statemachine.lifecycle import Lifecycle

log = logging.getLogger("runner")

EXIT_INTERRUPTED = 130

#: exit codes of the jobs of this process (one for a run; several for a serial multirun)
EXIT_CODES: list = []


def _build_checker(cfg: DictConfig) -> Checker:
    try:
        checker = instantiate(cfg.checker)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", "") or "a checker option"
        raise ConfigError(f"{key} is not set; e.g. 'checker.cmd=\"python check.py {{artifact}}\"' or checker=interactive") from None
    except Exception as e:
        # instantiate wraps the constructor's RunnerError in an InstantiationException
        cause = e.__cause__ or e.__context__
        if isinstance(cause, RunnerError):
            raise cause from None
        raise
    return checker


def _sigterm_to_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(cfg: DictConfig) -> int:
    """Run one job described by ``cfg``; never raises for user errors.

    Args:
        cfg: the composed Hydra config (see ``runner.config.RunConfig``).

    Returns:
        The process exit code: 0 when the run finished, 2 for a user error (one line printed),
        130 when interrupted (Ctrl-C or SIGTERM); ``summary.json`` is written in every case.
    """
    if cfg.verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    started = time.monotonic()
    summary: Dict[str, Any] = {"mode": cfg.mode.name, "status": "ok", "iterations": 0, "checks": 0, "reused": 0}
    lifecycle: Optional[Lifecycle] = None
    checker: Optional[Checker] = None
    code = 0
    previous = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    try:
        # cheap checks first: a bad replay file fails before the model is loaded
        replay = Replay(Path(cfg.replay.save), cfg.mode.name, Path(cfg.replay.load) if cfg.replay.load else None)
        strategy = get_method(cfg.mode._target_)(cfg)
        if getattr(strategy, "needs_checker", True):
            checker = _build_checker(cfg)
            checker.bind(cfg, strategy)
        iter_artifact = Path(cfg.artifacts.iter_artifact or run_dir(cfg) / f"iter_artifact{strategy.artifact_suffix}")
        paths = list(cfg.artifacts.paths) + [str(p) for p in strategy.artifacts()]
        sorter = ArtifactSorter(paths, Path(cfg.artifacts.dir), cfg.artifacts.keep_intermediate)
        progress = Progress(cfg.mode.name, enabled=not cfg.verbose)
        lifecycle = Lifecycle(strategy, checker, sorter, replay, iter_artifact, cfg.artifacts.iter_info, progress)
        try:
            lifecycle.run()
        finally:
            progress.close()
        strategy.finish()
        summary.update(strategy.result())
        summary["replay"] = str(replay.save_path)
    except RunnerError as e:
        if cfg.verbose:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        summary["status"] = f"error: {e}"
        code = e.exit_code
    except KeyboardInterrupt:
        summary["status"] = "interrupted"
        print("interrupted: the replay keeps every finished iteration; resume with replay.load=PATH", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BaseException as e:
        summary["status"] = f"internal error: {type(e).__name__}: {e}"
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if checker is not None:
            checker.close()
        if lifecycle is not None:
            summary.update(iterations=lifecycle.iteration, checks=lifecycle.checks, reused=lifecycle.reused_count)
        summary["wall_s"] = round(time.monotonic() - started, 3)
        try:
            write_json_atomic(Path(cfg.summary), summary)
        except OSError as e:
            print(f"error: cannot write summary={cfg.summary} ({e.strerror}); choose a writable path", file=sys.stderr)
            code = code or 2
    if code == 0:
        print_table(summary)
    return code

