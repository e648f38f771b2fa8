"""A run's parts, built once from its plan, in the order each needs the last.

``assemble`` locks the run directory, plans the run (``runner.run.plan``: the config read and checked
once, then frozen), resolves every path the run writes, opens the replay with the run's identity,
and builds the context, executor, checker, strategy and lifecycle; ``execute`` runs the lifecycle
and has the strategy write its answer. A report mode (a ``strategies.base.Report``: layerwise,
diff_tactics) takes the short path: no lifecycle, only its ``finish``.
Both fill one ``RunState`` as they go, so ``runner.run.app.run`` can report on a run that stopped at
any step, and register what must be released on two exit stacks: ``resources`` (the fatal-signal
log, the executor, the checker), closed before the summary is written, and ``holds`` (the output
plan's reservations, the run directory's lock), released after it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from runner.check_times import CheckTimes
from runner.checkers.base import Checker
from runner.checkers.make import make_checker
from runner.config import data_file_name
from runner.config_keys import keys_of, mode_uses
from runner.context import RunContext
from runner.errors import CheckNeverPassedError, ConfigError, RunnerError
from runner.executors.base import Executor
from runner.executors.spread import HERE
from runner.files.artifacts import ArtifactSorter
from runner.files.identity import run_identity
from runner.files.outputs import OutputPlan, plan_outputs
from runner.files.paths import run_dir
from runner.files.replay import Replay
from runner.files.rundir import lock_run_dir, refuse_finished, release_run_dir
from runner.run.plan import OUTPUT_OPTIONS, CheckerPlan, ExecutorPlan, RunPlan, executor_classes, plan
from runner.run.summary import Summary
from runner.terminal import console, logs, signals
from runner.terminal.logs import LogSettings
from runner.terminal.progress import Progress
from runner.write_guard import reading
from statemachine.lifecycle import Lifecycle
from strategies.base import Report, Strategy

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """What a run has built so far; every field is None until its step has run.

    Attributes:
        cfg: the composed config, as given (never written).
        summary: ``summary.json``'s record, filled as the run goes.
        directory: the locked run directory.
        summary_path: where the summary goes: a path the output plan accepted, or the run's own
            directory; never another run's.
        plan: the run's plan (``runner.run.plan``), its output paths resolved once ``outputs`` is.
        outputs, replay, executor, checker, strategy, lifecycle: the run's parts.
        log: the run's log keys, checked (``runner.terminal.logs``).
        check_times: each check's seconds (``runner.check_times``), for ``marker=auto``.
    """

    cfg: DictConfig
    summary: Summary
    directory: Optional[Path] = None
    summary_path: Optional[Path] = None
    plan: Optional[RunPlan] = None
    outputs: Optional[OutputPlan] = None
    replay: Optional[Replay] = None
    executor: Optional[Executor] = None
    checker: Optional[Checker] = None
    strategy: Optional[Strategy | Report] = None
    lifecycle: Optional[Lifecycle] = None
    log: LogSettings = field(default_factory=LogSettings)
    check_times: CheckTimes = field(default_factory=CheckTimes)


def _someone_answers() -> bool:
    """Whether standard input is a terminal or a pipe, which can answer an interactive check (a file or
    ``/dev/null``, as under a scheduler, cannot)."""
    import stat

    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # no stdin, or one without a descriptor
        return False
    return sys.stdin.isatty() or stat.S_ISFIFO(mode)


def _build_checker(plan: CheckerPlan) -> Checker:
    """The run's checker (``checker=``), given its schema whole (``Checker.schema``, filled by
    ``runner.checkers.base.conf_of``), in a child process with ``checker.isolate``.

    Raises:
        ConfigError: a mandatory checker key is not set; what the checker's constructor raises.
    """
    try:
        return make_checker(plan.options, plan.isolate, plan.timeout_s)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", "") or "option"
        key = key if key.startswith("checker.") else f"checker.{key}"
        if key == "checker.cmd" and _someone_answers():  # as Polygraphy: no check given, it asks
            from runner.checkers.interactive import InteractiveChecker

            log.info("No check command given (checker.cmd): each candidate is asked about, as Polygraphy does")
            return InteractiveChecker()
        else:
            raise ConfigError(
                f"{key} is not set; e.g. 'checker.cmd=\"python check.py {{artifact}}\"' or checker=interactive"
            ) from None
    except Exception as e:
        _raise_cause(e)


def _raise_cause(e: Exception) -> NoReturn:
    """``instantiate`` wraps what a constructor raised: re-raise a user error as itself, else ``e``."""
    if isinstance(e, RunnerError):
        raise e
    cause = e.__cause__ or e.__context__
    if isinstance(cause, (RunnerError, KeyboardInterrupt)):
        raise cause from None
    raise e


def _under_hydra() -> bool:
    """Whether Hydra's config is set for this run: a job Hydra started, which may have written its job files
    (``runner.files.rundir.HYDRA_JOB_FILES``) before the run, or the API's composed run, which writes neither."""
    try:
        HydraConfig.get()
    except ValueError:
        return False
    return True


def user_overrides() -> List[str]:
    """The user's command-line overrides (none known outside Hydra)."""
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not running under Hydra (library use)
        return []


def _context(
    plan: RunPlan,
    directory: Path,
    executor: Optional[Executor],
    identity: Dict[str, Any],
    started: float,
) -> RunContext:
    """The run's shared context from the (output-resolved) plan, with the executor's workers and lanes, the run's
    identity, where earlier rankings are (beside a loaded replay, and ``rankings=``) and when the run started
    (``time.monotonic``)."""
    loaded, given = plan.get("replay.load"), plan.get("rankings")
    sources = ([Path(loaded).parent] if loaded else []) + ([Path(given)] if given else [])
    return RunContext(
        mode=plan.mode,
        run_dir=directory,
        model_path=plan.model,
        model_files=plan.model_files,
        input_shapes=plan.get("model_input_shapes"),
        inputs=plan.get("inputs"),
        golden=plan.get("golden"),
        save_golden=plan.get("save_golden"),
        seed=plan.get("seed", 0),
        data_loader=plan.get("data_loader"),
        max_samples=plan.get("data_loader_max_samples", 1000),
        max_sample_mb=plan.get("data_loader_max_mb", 64.0),
        cuts_tensors=bool(plan.config.mode.get("cuts_tensors")),
        val_range=plan.get("val_range"),
        iterations=plan.get("iterations", 1),
        workers=executor.workers if executor is not None else 1,
        lanes=executor.lanes() if executor is not None else HERE,
        identity=identity,
        ranking_sources=sources,
        started=started,
    )


def _build_executor(plan: ExecutorPlan) -> Executor:
    """The executor of the run's checks (``executor=``), built with the keys its class takes.

    Raises:
        ConfigError: bad executor options (workers, GPUs, an unreachable Dask scheduler).
        MissingExtraError: ``executor=dask`` without the ``dask`` extra.
    """
    try:
        executor: Executor = executor_classes()[plan.name](**plan.options)
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


def _build_strategy(
    plan: RunPlan, ctx: RunContext, checker: Optional[Checker] = None, times: Optional[CheckTimes] = None
) -> Strategy | Report:
    """Call the mode's ``create`` (``mode._target_``) with the context, its keys whole (``keys_of``), the
    checker and, for modes with a marker, the marker factory (given the run's check ``times`` where it chooses by
    a check's cost: ``marker=auto``)."""
    keys = keys_of(plan.mode, plan.config)
    marker = instantiate(plan.config.marker, _partial_=True) if mode_uses(plan.mode, "marker") else None
    if marker is not None and getattr(marker.func, "takes_check_times", False):
        marker = functools.partial(marker.func, *marker.args, **{**marker.keywords, "times": times})
    try:
        strategy: Strategy | Report = get_method(plan.config.mode._target_)(ctx, keys, checker=checker, marker=marker)
    except Exception as e:
        _raise_cause(e)
    return strategy


def assemble(state: RunState, resources: contextlib.ExitStack, holds: contextlib.ExitStack) -> None:
    """Build the run's parts into ``state`` (see the module docstring).

    Raises:
        RunnerError: a user error at any step (the parts built so far are on the stacks).
    """
    # a directory the guard of Hydra's run start did not lock (a sweep's job, a re-run from a snapshot) holds what
    # Hydra wrote for this job already
    state.directory = directory = lock_run_dir(run_dir(state.cfg), hydra_wrote=_under_hydra())
    holds.callback(release_run_dir, directory)
    refuse_finished(directory, bool(state.cfg.get("reuse_run_dir", False)))
    state.summary_path = directory / "summary.json"
    fatal = directory / "fatal.log"  # a check that kills the runner leaves it (runner.files.replay)
    resources.enter_context(signals.fatal_log(fatal))
    state.plan = given = plan(state.cfg, user_overrides())
    holds.enter_context(reading(given.files_read))  # from here on, no writer replaces a file the run reads
    requested, defaults = given.requested_outputs()
    state.outputs = outputs = plan_outputs(
        requested,
        defaults,
        given.files_read,
        given.get("artifacts.paths", []),
        bool(given.get("overwrite", False)),
        directory,
        data_file_name(given.get("external_data_path")),
    )
    holds.callback(outputs.release)
    if outputs.get("log_file") is not None:  # from here on, every line also goes to log_file=
        resources.enter_context(logs.log_file(outputs.paths["log_file"], state.log))
    state.plan = planned = given.with_outputs({key: outputs.get(key) for key in OUTPUT_OPTIONS})
    state.summary_path = outputs.get("summary") or state.summary_path
    # cheap checks first: a bad replay file fails before the model is loaded
    load = planned.get("replay.load")
    state.replay = Replay(
        Path(planned.get("replay.save")),
        planned.mode,
        Path(load) if load else None,
        run_identity(planned.config, list(planned.model_files)),
        bool(planned.get("replay.force", False)),
        bool(planned.get("replay.retry_pending", False)),
        fatal,
    )
    if planned.executor is not None:
        # the checker's class first: its module registers what worker processes warm (runner.executors.worker)
        checker_class: type[Checker] = get_class(planned.get("checker._target_"))
        state.executor = _build_executor(planned.executor)
        resources.callback(state.executor.close)
        if state.executor.workers > 1 and not checker_class.concurrent:
            # by its class: the interactive checker asks for a terminal when it is built
            raise ConfigError("checker=interactive asks one question at a time; use executor=serial")
    ctx = _context(planned, directory, state.executor, state.replay.identity, state.summary.started)
    if planned.takes_checker:
        _adopt_checker(state, resources)
    state.strategy = strategy = _build_strategy(planned, ctx, state.checker, state.check_times)
    if isinstance(strategy, Report):
        return  # layerwise, diff_tactics: no candidates, no lifecycle; execute() runs its finish()
    checker = state.checker or _adopt_checker(state, resources)  # a mode that takes the checker checks with it
    checker.output_dir = directory / "checks"
    checker.bind(ctx)
    if strategy.hit_on_pass is not None:  # the ONNX searches (reduce, precision) rely on a monotone failure
        state.replay.watch(strategy.hit_on_pass)
    iter_artifact = Path(
        planned.get("artifacts.iter_artifact") or directory / f"iter_artifact{strategy.artifact_suffix}"
    )
    paths = list(planned.get("artifacts.paths", [])) + [str(p) for p in strategy.artifacts()]
    if state.executor is not None:
        _check_worker_paths(state.executor, paths)
    sorter = ArtifactSorter(paths, Path(planned.get("artifacts.dir")), bool(planned.get("artifacts.keep_intermediate")))
    progress = Progress(planned.mode, enabled=not planned.get("verbose") and console.progress_bar())
    resources.callback(progress.close)
    state.lifecycle = Lifecycle(
        strategy,
        state.checker,
        sorter,
        state.replay,
        iter_artifact,
        planned.get("artifacts.iter_info"),
        progress,
        state.executor,
        state.check_times,
    )


def _adopt_checker(state: RunState, resources: contextlib.ExitStack) -> Checker:
    assert state.plan is not None and state.plan.checker is not None, "a mode with checks has a checker"
    state.checker = checker = _build_checker(state.plan.checker)
    resources.callback(checker.close)
    return checker


def execute(state: RunState) -> None:
    """Run the lifecycle, then have the strategy write its answer; the result goes into ``state.summary``.

    Raises:
        CheckNeverPassedError: a mode that needs a passing check saw none.
        AnswerNotVerifiedError: the written answer did not give the search's verdict.
        RunnerError, KeyboardInterrupt: from the run.
    """
    lifecycle, strategy, replay = state.lifecycle, state.strategy, state.replay
    assert strategy is not None and replay is not None, "assemble() first"
    if isinstance(strategy, Report):  # its answer is all in finish()
        strategy.finish()
        state.summary.answer = strategy.result()
        return
    assert lifecycle is not None, "assemble() builds a lifecycle for every search"
    try:
        lifecycle.run()
    finally:
        if lifecycle.progress is not None:
            lifecycle.progress.close()
    if strategy.needs_pass and lifecycle.passes == 0:
        last = lifecycle.verdict
        hint = strategy.never_passed_hint()
        if hint is not None:
            raise CheckNeverPassedError(
                f"no check passed in {lifecycle.taken} iterations, and {hint}",
                tail=(last.output_tail if last is not None else ""),
            )
        raise CheckNeverPassedError(
            f"no check passed in {lifecycle.taken} iterations"
            f"{f' (every one {last.reason})' if last is not None and lifecycle.same_failure else ''}, so the "
            "answer would rest on the check, not the model; run the check by hand on the iteration artifact "
            "and fix it (see the check's output below and in the run directory's checks/)",
            tail=(last.output_tail if last is not None else ""),
        )
    strategy.finish()
    state.summary.answer = strategy.result()
    if lifecycle.verdict is not None and lifecycle.verdict.outputs is not None:
        state.summary.last_check_outputs = lifecycle.verdict.outputs  # compare: errors per output
    if replay.save_path.exists():  # a report mode checks nothing and writes no replay
        state.summary.replay = str(replay.save_path)


def counters(state: RunState) -> None:
    """Put the lifecycle's counters and ``wall_s`` in ``state.summary``, whatever step the run reached."""
    lifecycle, summary = state.lifecycle, state.summary
    if lifecycle is not None:
        summary.iterations, summary.checks, summary.reused = lifecycle.taken, lifecycle.checks, lifecycle.reused_count
        summary.counters = dict(
            check_s=round(lifecycle.check_s, 3),
            errors=lifecycle.errors,
            crashes=lifecycle.crashes,
            rounds=lifecycle.rounds,
            workers=lifecycle.executor.workers,
            executor=lifecycle.executor.name,
            **({"cancelled": lifecycle.cancelled} if lifecycle.cancelled else {}),
            **(lifecycle.checker.facts() if lifecycle.checker is not None else {}),
            **lifecycle.executor.facts(summary.started),
        )
        summary.reused_from_other_identity = lifecycle.reused_foreign
    summary.finish()
