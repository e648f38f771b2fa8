"""A run's parts, built once from the config, in the order each needs the last.

``assemble`` locks the run directory, checks the keys set for the mode, plans every path the run
writes, opens the replay with the run's identity, and builds the context, executor, checker,
strategy and lifecycle; ``execute`` runs the lifecycle and has the strategy write its answer. A
report mode (a ``strategies.base.Report``: layerwise, diff_tactics) takes the short path: no
lifecycle, only its ``finish``.
Both fill one ``RunState`` as they go, so ``runner.app.run`` can report on a run that stopped at
any step, and register what must be released on two exit stacks: ``resources`` (the fatal-signal
log, the executor, the checker), closed before the summary is written, and ``holds`` (the output
plan's reservations, the run directory's lock), released after it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, get_method, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from runner import console, signals
from runner.artifacts import ArtifactSorter
from runner.checkers.base import Checker
from runner.config import plain
from runner.config_keys import check_mode_keys, check_option_keys, group_keys, keys_of, mode_uses, set_keys
from runner.context import RunContext
from runner.errors import CheckNeverPassedError, ConfigError, RunnerError
from runner.executors.base import Executor, executor_classes
from runner.graph.model_files import model_files
from runner.identity import run_identity
from runner.inputs import files_read
from runner.outputs import OutputPlan, plan_outputs
from runner.paths import in_job_dir, run_dir
from runner.progress import Progress
from runner.replay import Replay
from runner.rundir import lock_run_dir, refuse_finished, release_run_dir
from statemachine.lifecycle import Lifecycle
from strategies.base import Report, Strategy


@dataclass
class RunState:
    """What a run has built so far; every field is None until its step has run.

    Attributes:
        cfg: the composed config (its output paths are rewritten to the planned ones).
        summary: ``summary.json``'s fields so far.
        started: ``time.monotonic()`` at the start, for ``wall_s``.
        directory: the locked run directory.
        summary_path: where the summary goes: a path the output plan accepted, or the run's own
            directory; never another run's.
        plan, replay, executor, checker, strategy, lifecycle: the run's parts.
    """

    cfg: DictConfig
    summary: Dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    directory: Optional[Path] = None
    summary_path: Optional[Path] = None
    plan: Optional[OutputPlan] = None
    replay: Optional[Replay] = None
    executor: Optional[Executor] = None
    checker: Optional[Checker] = None
    strategy: Optional[Strategy | Report] = None
    lifecycle: Optional[Lifecycle] = None


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
    timeout_s = None
    if "isolate" in node:  # the run's options, not the checker's
        options = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
        assert isinstance(options, dict)
        options.pop("isolate")
        timeout_s = options.pop("timeout_s", None)
        if timeout_s is not None and not isolate:
            raise ConfigError(
                "checker.timeout_s stops a check in its own process: set checker.isolate=true with it (an in-process "
                "check cannot be stopped)"
            )
        if timeout_s is not None and float(timeout_s) <= 0:
            raise ConfigError(f"checker.timeout_s={timeout_s}: give a number of seconds above 0")
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

        return IsolatedChecker(checker, None if timeout_s is None else float(timeout_s))
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


def _build_strategy(cfg: DictConfig, ctx: RunContext, checker: Optional[Checker] = None) -> Strategy | Report:
    """Call the mode's ``create`` (``cfg.mode._target_``) with the context, its keys whole
    (``keys_of``), the checker and, for modes with a marker, the marker factory."""
    keys = keys_of(cfg.mode.name, cfg)
    marker = instantiate(cfg.marker, _partial_=True) if mode_uses(cfg.mode.name, "marker") else None
    try:
        strategy: Strategy | Report = get_method(cfg.mode._target_)(ctx, keys, checker=checker, marker=marker)
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


def assemble(state: RunState, resources: contextlib.ExitStack, holds: contextlib.ExitStack) -> None:
    """Build the run's parts into ``state`` (see the module docstring).

    Raises:
        RunnerError: a user error at any step (the parts built so far are on the stacks).
    """
    cfg = state.cfg
    state.directory = directory = lock_run_dir(run_dir(cfg))
    holds.callback(release_run_dir, directory)
    refuse_finished(directory, bool(cfg.get("reuse_run_dir", False)))
    state.summary_path = directory / "summary.json"
    fatal = directory / "fatal.log"  # a check that kills the runner leaves it (runner.replay)
    resources.enter_context(signals.fatal_log(fatal))
    check_mode_keys(cfg.mode.name, _set_keys())
    executor_name = OmegaConf.select(cfg, "executor.name")
    if OmegaConf.select(cfg, "checker.isolate") and executor_name in ("processes", "dask"):
        raise ConfigError(
            f"checker.isolate=true with executor={executor_name}: its checks already run in worker processes, "
            "where a crash is the worker's; drop one of the two"
        )
    files = model_files(cfg.get("model"))  # the model and its external data: read, never written
    state.plan = plan = _plan(cfg, _files_read(cfg))
    holds.callback(plan.release)
    state.summary_path = plan.get("summary") or state.summary_path
    # cheap checks first: a bad replay file fails before the model is loaded
    state.replay = Replay(
        Path(cfg.replay.save),
        cfg.mode.name,
        Path(cfg.replay.load) if cfg.replay.load else None,
        run_identity(cfg, files),
        cfg.replay.force,
        bool(cfg.replay.get("retry_pending", False)),
        fatal,
    )
    ctx = _context(cfg, directory, files)
    if mode_uses(cfg.mode.name, "executor"):
        state.executor = executor = _build_executor(cfg)
        resources.callback(executor.close)
        ctx.workers, ctx.lanes = executor.workers, executor.job_lanes()
        if executor.workers > 1 and not getattr(get_class(cfg.checker._target_), "concurrent", True):
            # by its class: the interactive checker asks for a terminal when it is built
            raise ConfigError("checker=interactive asks one question at a time; use executor=serial")
    if cfg.mode.get("takes_checker"):
        _adopt_checker(state, resources)
    state.strategy = strategy = _build_strategy(cfg, ctx, state.checker)
    if isinstance(strategy, Report):
        return  # layerwise, diff_tactics: no candidates, no lifecycle; execute() runs its finish()
    checker = state.checker or _adopt_checker(state, resources)  # a mode that takes the checker checks with it
    checker.output_dir = directory / "checks"
    checker.bind(ctx)
    monotone = getattr(strategy, "hit_on_pass", None)  # the ONNX searches (reduce, precision) rely on it
    if monotone is not None and state.replay is not None:
        state.replay.watch(bool(monotone))
    iter_artifact = Path(cfg.artifacts.iter_artifact or directory / f"iter_artifact{strategy.artifact_suffix}")
    paths = list(cfg.artifacts.paths) + [str(p) for p in strategy.artifacts()]
    if state.executor is not None:
        _check_worker_paths(state.executor, paths)
    sorter = ArtifactSorter(paths, Path(cfg.artifacts.dir), cfg.artifacts.keep_intermediate)
    progress = Progress(cfg.mode.name, enabled=not cfg.verbose and console.progress_bar())
    resources.callback(progress.close)
    state.lifecycle = Lifecycle(
        strategy, state.checker, sorter, state.replay, iter_artifact, cfg.artifacts.iter_info, progress, state.executor
    )


def _adopt_checker(state: RunState, resources: contextlib.ExitStack) -> Checker:
    state.checker = checker = _build_checker(state.cfg)
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
        state.summary.update(strategy.result())
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
    state.summary.update(strategy.result())
    if lifecycle.verdict is not None and lifecycle.verdict.outputs is not None:
        state.summary["last_check_outputs"] = lifecycle.verdict.outputs  # compare: errors per output
    if replay.save_path.exists():  # a report mode checks nothing and writes no replay
        state.summary["replay"] = str(replay.save_path)


def counters(state: RunState) -> None:
    """Add the lifecycle's counters and ``wall_s`` to ``state.summary``, whatever step the run reached."""
    lifecycle = state.lifecycle
    if lifecycle is not None:
        state.summary.update(
            iterations=lifecycle.taken,
            checks=lifecycle.checks,
            reused=lifecycle.reused_count,
            check_s=round(lifecycle.check_s, 3),
            errors=lifecycle.errors,
            crashes=lifecycle.crashes,
            rounds=lifecycle.rounds,
            workers=lifecycle.executor.workers,
            executor=lifecycle.executor.name,
        )
        if lifecycle.cancelled:
            state.summary["cancelled"] = lifecycle.cancelled
        state.summary.update(lifecycle.executor.facts(state.started))
        if lifecycle.reused_foreign:
            state.summary["reused_from_other_identity"] = lifecycle.reused_foreign
    state.summary["wall_s"] = round(time.monotonic() - state.started, 3)
