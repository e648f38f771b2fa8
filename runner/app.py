"""One run: build the strategy, checker and lifecycle from the config, run it, write the summary."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

import onnx
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from runner import console, signals
from runner.artifacts import ArtifactSorter
from runner.checkers.base import Checker
from runner.config import check_mode_keys, check_option_keys, group_keys, mode_options, mode_uses, plain, set_keys
from runner.context import RunContext
from runner.errors import (
    AnswerNotVerifiedError,
    CheckNeverPassedError,
    ConfigError,
    InvalidCandidateError,
    RunnerError,
)
from runner.executors.base import Executor, executor_classes
from runner.graph.load import save_model
from runner.identity import run_identity
from runner.inputs import files_read
from runner.jsonio import write_json_atomic
from runner.outputs import OutputPlan, model_files, plan_outputs
from runner.paths import in_job_dir, run_dir
from runner.progress import Progress
from runner.replay import Replay
from runner.report import print_table
from runner.rundir import lock_run_dir, refuse_finished, release_run_dir
from statemachine.lifecycle import Lifecycle
from strategies.base import Strategy

log = logging.getLogger("runner")

#: the config keys of the files a run writes that a user can name
OUTPUT_OPTIONS = (
    "output",
    "min_good",
    "artifacts.iter_artifact",
    "summary",
    "replay.save",
    "artifacts.iter_info",
    "save_golden",
)


def _build_checker(cfg: DictConfig) -> Checker:
    node = cfg.checker
    isolate = bool(node.get("isolate", False))
    if "isolate" in node:  # the run's option, not the checker's
        options = OmegaConf.to_container(node, resolve=True)
        assert isinstance(options, dict)
        options.pop("isolate")
        node = OmegaConf.create(options)
    try:
        checker = instantiate(node)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", "") or "a checker option"
        raise ConfigError(
            f"{key} is not set; e.g. 'checker.cmd=\"python check.py {{artifact}}\"' or checker=interactive"
        ) from None
    except Exception as e:
        _raise_cause(e)
    if isolate:
        from runner.checkers.isolated import IsolatedChecker

        return IsolatedChecker(checker)
    return checker


def _raise_cause(e: Exception) -> None:
    """``instantiate`` wraps what a constructor raised: re-raise a user error as itself, else ``e``."""
    if isinstance(e, RunnerError):
        raise e
    cause = e.__cause__ or e.__context__
    if isinstance(cause, (RunnerError, KeyboardInterrupt)):
        raise cause from None
    raise e


def _overrides() -> List[str]:
    """The user's command-line overrides (none known outside Hydra)."""
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not running under Hydra (library use)
        return []


def _set_keys() -> List[str]:
    """The top-level keys the user set on the command line."""
    return set_keys(_overrides())


def _context(cfg: DictConfig, directory: Path, files: List[Path]) -> RunContext:
    """The run's shared context from the (already planned) config and the model's files."""
    return RunContext(
        mode=cfg.mode.name,
        run_dir=directory,
        model_path=Path(cfg.model) if cfg.get("model") else None,
        model_files=files,
        input_shapes=cfg.get("model_input_shapes"),
        inputs=cfg.get("inputs"),
        golden=cfg.get("golden"),
        save_golden=cfg.get("save_golden"),
        seed=cfg.get("seed", 0),
        data_loader=cfg.get("data_loader"),
        val_range=plain(cfg.get("val_range")),
    )


def _build_executor(cfg: DictConfig) -> Executor:
    """The executor of the run's checks (``executor=``).

    The executor is built with the keys its class takes; a key set on the command line that it does
    not take is an error naming the executors that do (``executor=serial executor.gpus=[0]``).

    Raises:
        ConfigError: bad executor options (keys it does not use, workers, GPUs, an unreachable Dask
            scheduler).
        MissingExtraError: ``executor=dask`` without the ``dask`` extra.
    """
    options = executor_classes()
    name = cfg.executor.name
    takes = check_option_keys("executor", name, group_keys("executor", _overrides()), options)
    try:
        executor: Executor = options[name](**{k: plain(v) for k, v in cfg.executor.items() if k in takes})
    except Exception as e:
        _raise_cause(e)
    return executor


def _check_worker_paths(executor: Executor, artifact_paths: List[str]) -> None:
    """Refuse ``artifacts.paths`` that several checks at once would write at the same path.

    Raises:
        ConfigError: with more than one worker, a path without ``{worker}`` in it.
    """
    if executor.workers <= 1:
        return
    shared = [p for p in artifact_paths if "{worker}" not in p]
    if shared:
        raise ConfigError(
            f"artifacts.paths={shared} would be written by {executor.workers} checks at once: put {{worker}} in each "
            "path (and in checker.cmd, or read RUNNER_WORKER in the check), or use executor=serial"
        )


def _build_strategy(cfg: DictConfig, ctx: RunContext, checker: Optional[Checker] = None) -> Strategy:
    """``instantiate`` the mode's ``_target_`` (its ``create``) with the keys it names
    (``mode_options``), then call it with the context (and the marker factory, for modes with a
    marker; the checker, for modes that take it)."""
    options = mode_options(cfg.mode.name, cfg, get_method(cfg.mode._target_))
    extra: Dict[str, Any] = {"ctx": ctx}
    if checker is not None:
        extra["checker"] = checker
    if mode_uses(cfg.mode.name, "marker"):
        extra["marker"] = instantiate(cfg.marker, _partial_=True)
    try:
        factory = instantiate({"_target_": cfg.mode._target_, **options}, _partial_=True, _convert_="all")
        strategy: Strategy = factory(**extra)
    except Exception as e:
        _raise_cause(e)
    return strategy


def _plan(cfg: DictConfig, protected: Dict[Path, str]) -> OutputPlan:
    """Resolve every output path (see ``runner.outputs``) and write the resolved ones back into ``cfg``.

    Args:
        cfg: the run's config (updated in place).
        protected: ``{path: what it is}`` of every file the run reads (``runner.inputs.files_read``).
    """
    options = {}
    for key in OUTPUT_OPTIONS:
        value = OmegaConf.select(cfg, key)
        options[key] = in_job_dir(key, value) if key in ("output", "min_good") else value
    default = in_job_dir("output", cfg.mode.get("default_output"))
    plan = plan_outputs(options, {"output": default} if default else {}, protected, list(cfg.artifacts.paths))
    with open_dict(cfg):
        for key in OUTPUT_OPTIONS:
            if plan.get(key) is not None:
                OmegaConf.update(cfg, key, str(plan.get(key)), merge=False)
    return plan


def _files_read(cfg: DictConfig) -> Dict[Path, str]:
    """Every file the run reads (``runner.inputs.files_read``): never written, moved or linked over."""
    data = {key: OmegaConf.select(cfg, key) for key in ("inputs", "golden", "replay.load", "reference_model")}
    modules = [cfg.get("data_loader"), OmegaConf.select(cfg, "checker.target")]
    return files_read(cfg.get("model"), data, modules, OmegaConf.select(cfg, "checker.cmd"))


def _say(text: str) -> None:
    """Print to stderr (unless ``silent=true``); a closed terminal (SIGHUP) or pipe must not turn into a
    second error."""
    console.error(text)


def _save_invalid(error: InvalidCandidateError, directory: Optional[Path]) -> str:
    """Save the invalid model the tool built into the run directory, for the defect report; the
    words to add to the error ("" when there is none to save or it cannot be written)."""
    if not isinstance(error.model, onnx.ModelProto) or directory is None:
        return ""
    path = directory / "invalid_candidate.onnx"
    try:
        save_model(error.model, path)
    except Exception as e:  # the report must not hide the error itself
        log.warning("Could not save the invalid model to %s: %s", path, e)
        return ""
    return f" (saved as {path})"


def run(cfg: DictConfig) -> int:
    """Run one job described by ``cfg``; never raises for user errors.

    Args:
        cfg: the composed Hydra config (see ``runner.config.RunConfig``).

    Returns:
        The process exit code: 0 when the run finished, 2 for a user error or a check that never
        passed (one line printed), 3 when the written answer failed its own check, 128 + the signal
        when interrupted (130 Ctrl-C, 143 SIGTERM,
        129 SIGHUP); ``summary.json`` is written in every case.
    """
    if cfg.verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    started = time.monotonic()
    summary: Dict[str, Any] = {"mode": cfg.mode.name, "status": "ok", "iterations": 0, "checks": 0, "reused": 0}
    lifecycle: Optional[Lifecycle] = None
    checker: Optional[Checker] = None
    executor: Optional[Executor] = None
    directory: Optional[Path] = None
    summary_path: Optional[Path] = None  # only a path the output plan accepted, or the run's own directory
    plan: Optional[OutputPlan] = None
    code = 0
    fatal_stack = contextlib.ExitStack()
    with signals.handled():
        try:
            console.configure(cfg.get("quiet", 0), bool(cfg.get("silent", False)), bool(cfg.verbose))
            directory = lock_run_dir(run_dir(cfg))
            refuse_finished(directory, bool(cfg.get("reuse_run_dir", False)))
            summary_path = directory / "summary.json"
            fatal = directory / "fatal.log"  # a check that kills the runner leaves it (runner.replay)
            fatal_stack.enter_context(signals.fatal_log(fatal))
            check_mode_keys(cfg.mode.name, _set_keys())
            files = model_files(cfg.get("model"))  # the model and its external data: read, never written
            plan = _plan(cfg, _files_read(cfg))
            summary_path = plan.get("summary") or summary_path
            # cheap checks first: a bad replay file fails before the model is loaded
            identity = run_identity(cfg, files)
            replay = Replay(
                Path(cfg.replay.save),
                cfg.mode.name,
                Path(cfg.replay.load) if cfg.replay.load else None,
                identity,
                cfg.replay.force,
                bool(cfg.replay.get("retry_pending", False)),
                fatal,
            )
            ctx = _context(cfg, directory, files)
            if mode_uses(cfg.mode.name, "executor"):
                executor = _build_executor(cfg)
                ctx.workers = executor.workers
                if executor.workers > 1 and not getattr(get_class(cfg.checker._target_), "concurrent", True):
                    # by its class: the interactive checker asks for a terminal when it is built
                    raise ConfigError("checker=interactive asks one question at a time; use executor=serial")
            if cfg.mode.get("takes_checker"):
                checker = _build_checker(cfg)
            strategy = _build_strategy(cfg, ctx, checker)
            if strategy.needs_checker:
                if checker is None:  # a mode that takes the checker checks with that one
                    checker = _build_checker(cfg)
                checker.output_dir = directory / "checks"
                checker.bind(ctx)
            iter_artifact = Path(cfg.artifacts.iter_artifact or directory / f"iter_artifact{strategy.artifact_suffix}")
            paths = list(cfg.artifacts.paths) + [str(p) for p in strategy.artifacts()]
            if executor is not None and strategy.needs_checker:
                _check_worker_paths(executor, paths)
            sorter = ArtifactSorter(paths, Path(cfg.artifacts.dir), cfg.artifacts.keep_intermediate)
            progress = Progress(cfg.mode.name, enabled=not cfg.verbose and console.progress_bar())
            lifecycle = Lifecycle(
                strategy, checker, sorter, replay, iter_artifact, cfg.artifacts.iter_info, progress, executor
            )
            try:
                lifecycle.run()
            finally:
                progress.close()
            if strategy.needs_pass and lifecycle.passes == 0:
                last = lifecycle.verdict
                raise CheckNeverPassedError(
                    f"no check passed in {lifecycle.taken} iterations"
                    f"{f' (every one {last.reason})' if last is not None and lifecycle.same_failure else ''}, so the "
                    "answer would rest on the check, not the model; run the check by hand on the iteration artifact "
                    "and fix it (see the check's output below and in the run directory's checks/)",
                    tail=(last.details.get("output_tail", "") if last is not None else ""),
                )
            strategy.finish()
            summary.update(strategy.result())
            if lifecycle.verdict is not None and "outputs" in lifecycle.verdict.details:
                summary["last_check_outputs"] = lifecycle.verdict.details["outputs"]  # compare: errors per output
            if replay.save_path.exists():  # a report mode checks nothing and writes no replay
                summary["replay"] = str(replay.save_path)
        except AnswerNotVerifiedError as e:
            summary.update(status=e.status, error=str(e), answer_verified=e.verified)
            _say(f"error: {e.status}: {e}")
            code = e.exit_code
        except CheckNeverPassedError as e:
            summary.update(status=e.status, error=str(e), check_output_tail=e.tail)
            _say(f"error: {e.status}: {e}" + (f"\nlast check's output:\n{e.tail.rstrip()}" if e.tail.strip() else ""))
            code = e.exit_code
        except InvalidCandidateError as e:
            message = f"{e}{_save_invalid(e, directory)}"
            _say(f"error: {message}")
            summary["status"] = f"error: {message}"
            code = e.exit_code
        except RunnerError as e:
            if cfg.verbose:
                traceback.print_exc()
            _say(f"error: {e}")
            summary["status"] = f"error: {e}"
            code = e.exit_code
        except OSError as e:  # a file error nothing nearer caught (a full disk, a file made read-only mid-run)
            where = f": {e.filename}" if e.filename else ""
            message = f"{e.strerror or e}{where}; free some space or fix the file's location, then resume"
            _say(f"error: {message}")
            summary["status"] = f"error: {message}"
            code = 2
        except KeyboardInterrupt as e:
            summary["status"] = "interrupted"
            _say("interrupted: the replay keeps every finished iteration; resume with replay.load=PATH")
            code = signals.exit_code(e)
        except BaseException as e:
            summary["status"] = f"internal error: {type(e).__name__}: {e}"
            raise
        finally:
            fatal_stack.close()
            if executor is not None:
                executor.close()
            if checker is not None:
                checker.close()
            if lifecycle is not None:
                summary.update(
                    iterations=lifecycle.taken,
                    checks=lifecycle.checks,
                    reused=lifecycle.reused_count,
                    errors=lifecycle.errors,
                    crashes=lifecycle.crashes,
                    rounds=lifecycle.rounds,
                    workers=lifecycle.executor.workers,
                    executor=lifecycle.executor.name,
                )
                if lifecycle.cancelled:
                    summary["cancelled"] = lifecycle.cancelled
                if lifecycle.reused_foreign:
                    summary["reused_from_other_identity"] = lifecycle.reused_foreign
            summary["wall_s"] = round(time.monotonic() - started, 3)
            if summary_path is not None:  # never a rejected path, never another run's directory
                try:
                    write_json_atomic(summary_path, summary)
                except OSError as e:
                    _say(f"error: cannot write summary={summary_path} ({e.strerror}); choose a writable path")
                    code = code or 2
            if plan is not None:
                plan.release()
            if directory is not None:
                release_run_dir(directory)
    if code == 0:
        console.result(lambda: _print_quietly(summary))
    console.restore()
    return code


def _print_quietly(summary: Dict[str, Any]) -> None:
    """Print the final table; a reader that went away (``| head``) silences stdout, not the run."""
    try:
        print_table(summary)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
