"""The pieces of a debug loop of your own, as Polygraphy's ``CheckCmdArgs.run_check`` and
``ArtifactSortArgs.sort_artifacts`` give a script that iterates itself:

    from runner import api

    for i, model in enumerate(my_candidates(), 1):
        onnx.save(model, "candidate.onnx")
        verdict = api.run_check("candidate.onnx", "polygraphy run {artifact} --onnxrt", iteration=i)
        api.sort_artifacts(verdict, ["candidate.onnx", "tactics.json"], "artifacts", iteration=i)

``run_check`` judges one file with any checker the command line has (a command, a Python callable, ``compare``
with a model's golden values, ``validate``), built from the same schemas, and returns the ``Verdict`` (``passed``,
``reason``, the return code, per-output statistics). ``sort_artifacts`` moves files into ``good/`` or ``bad/``
with the iteration, time and return code in their names, never replacing a file there.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from runner.candidates import Candidate, Verdict

#: the keyword arguments of ``run_check`` that describe the data (``RunContext``'s), not the checker
CONTEXT_KEYS = (
    "inputs",
    "golden",
    "data_loader",
    "data_loader_max_samples",
    "data_loader_max_mb",
    "val_range",
    "seed",
    "iterations",
    "model_input_shapes",
)


def run_check(
    artifact: Union[str, Path],
    check: Union[str, Callable[[str], bool]],
    *,
    iteration: int = 1,
    model: Optional[Union[str, Path]] = None,
    **options: Any,
) -> Verdict:
    """Judge one file as a run's checker would.

    Args:
        artifact: the file to check (a model, an engine, whatever the check reads).
        check: a command line (``{artifact}`` becomes the path, as ``checker.cmd``), a checker's name
            (``"compare"``, ``"validate"``, ``"command"`` with ``cmd=`` in ``options``), or a callable
            ``fn(artifact_path) -> bool`` (True: passes).
        iteration: the iteration number the check sees (``RUNNER_ITERATION``, ``{iteration}``).
        model: the model whose inputs and golden values ``compare`` and ``validate`` use (``model=``); not
            needed by a command or a callable.
        options: the checker's keys (``rtol=0.05``, ``fail_regex=[...]``) and the data's
            (``inputs``, ``golden``, ``data_loader``, ``data_loader_max_samples``, ``val_range``, ``seed``,
            ``iterations``, ``model_input_shapes``), as on the command line.

    Returns:
        The verdict (``passed``, ``reason``, ``returncode``, ``outputs``...).

    Raises:
        ApiError: an unknown checker name or key, or ``compare``/``validate`` without ``model``.
        RunnerError: what the checker raises for bad input (a one-line message naming the fix).
    """
    from runner.errors import ApiError, ConfigError

    path = Path(artifact).absolute()
    data = {k: options.pop(k) for k in CONTEXT_KEYS if k in options}
    registered: List[str] = []
    try:
        checker = _checker(check, options, registered)
    except ConfigError as e:
        _release(registered)
        raise ApiError(str(e)) from None
    try:
        with tempfile.TemporaryDirectory(prefix="runner-check-") as scratch:
            if checker.reads_model:
                if model is None:
                    raise ApiError(f"check={check!r} runs the model's inputs through the file: give model=PATH")
                checker.bind(_context(Path(model), Path(scratch), data))
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "none"
            candidate = Candidate(key=f"api:{iteration}:{digest}", label=path.name)
            return checker.check(path, iteration, candidate)
    finally:
        checker.close()
        _release(registered)


def _release(keys: List[str]) -> None:
    from runner.callables import release

    for key in keys:
        release(key)


def sort_artifacts(
    verdict: Union[Verdict, bool],
    paths: Sequence[Union[str, Path]],
    artifacts_dir: Union[str, Path] = "artifacts",
    *,
    iteration: int = 1,
) -> List[Path]:
    """Move ``paths`` into ``artifacts_dir/good`` or ``artifacts_dir/bad`` by the verdict
    (``runner.files.artifacts.ArtifactSorter``: ``<stem>_iter<N>_<time>_rc<code><suffix>``, never replacing a file).

    Args:
        verdict: the check's verdict, or whether it passed.
        paths: files or folders to move (a missing one is a warning, as Polygraphy's).
        artifacts_dir: where ``good/`` and ``bad/`` are made.
        iteration: the iteration number in the new names.

    Returns:
        The new paths.

    Raises:
        ArtifactError: the directory cannot be written, or a file cannot be moved.
        ApiError: ``paths`` is one string or path (its letters are no list of files) or holds something else.
    """
    from runner.errors import ApiError
    from runner.files.artifacts import ArtifactSorter

    if isinstance(paths, (str, Path)):
        raise ApiError(f"sort_artifacts(paths={str(paths)!r}): give a list of files or folders, e.g. [{str(paths)!r}]")
    wrong = [p for p in paths if not isinstance(p, (str, Path))]
    if wrong:
        raise ApiError(f"sort_artifacts(paths=...): {wrong[0]!r} is no path; give files or folders as str or Path")

    judged = verdict if isinstance(verdict, Verdict) else Verdict(bool(verdict))
    return ArtifactSorter([str(p) for p in paths], Path(artifacts_dir)).sort(iteration, judged)


def _checker(check: Union[str, Callable[[str], bool]], options: Dict[str, Any], registered: List[str]) -> Any:
    """The checker ``check`` names, built as a run builds it (``runner.run.plan.checker_plan_of``,
    ``runner.checkers.make.make_checker``); a callable's registration key goes into ``registered`` (released after
    the check).

    Raises:
        ConfigError: an unknown key, a value the checker refuses, or ``timeout_s`` without ``isolate``.
    """
    from omegaconf import OmegaConf

    from conf import checker_groups, checker_schema
    from runner import config
    from runner.checkers.make import make_checker
    from runner.config import plain
    from runner.run.plan import checker_plan_of

    if callable(check):
        from runner.callables import TARGET, register

        registered.append(register(check))
        options = {**options, "target": TARGET, "args": [registered[-1], *options.get("args", [])]}
        check = "python"
    elif check not in checker_groups():
        options = {**options, "cmd": check}
        check = "command"
    defaults = plain(OmegaConf.structured(getattr(config, checker_schema(check))))  # the schema's, as a run's
    plan = checker_plan_of({**defaults, **options})
    return make_checker(plan.options, plan.isolate, plan.timeout_s)


def _context(model: Path, scratch: Path, data: Dict[str, Any]) -> Any:
    """A run context for ``model`` with the data keys given (its run directory a scratch folder)."""
    from runner.context import RunContext

    shapes = data.pop("model_input_shapes", None)
    if "data_loader_max_samples" in data:  # the run's keys for the context's bounds
        data["max_samples"] = data.pop("data_loader_max_samples")
    if "data_loader_max_mb" in data:
        data["max_sample_mb"] = data.pop("data_loader_max_mb")
    return RunContext(  # a file judged alone may be any subgraph: every sample keeps every tensor
        mode="check", run_dir=scratch, model_path=model.absolute(), input_shapes=shapes, cuts_tensors=True, **data
    )
