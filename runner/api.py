"""The Python API: each mode as a function, with the command line's keys and answers.

    from runner import api

    result = api.reduce("model.onnx", "python check.py {artifact}", model_input_shapes={"x": [1, 3, 48, 192]})
    result.ok, result.summary["reduced_nodes"], result.run_dir

    result = api.precision("bert.onnx", "compare", marker="minimal", inputs="bert.npz",
                           checker={"backend": "fp16_emulation", "check_error_stat": "rel_l2", "rtol": 0.05})
    [n["name"] for n in result.summary["kept_nodes"]]

Each function composes the same Hydra config as ``python -m runner`` (``conf/``, the same schemas,
the same one-line errors) and runs it with ``runner.run.app.run``, so a call gives the command
line's answer. Keys are the command line's, as keyword arguments: flat ones as they are
(``marker="minimal"``, ``min_good="good.onnx"``), groups as dicts (``checker={"rtol": 0.05}``,
``executor={"workers": 4}``) or dotted strings in ``overrides``. The check is a command line
(``"python check.py {artifact}"``), the name of a checker (``"compare"``, ``"interactive"``), or a
Python callable ``fn(artifact_path) -> bool`` (True: the candidate passes), run in this process
(or, with ``checker={"isolate": True}``, in a child process it is sent to) and known by a digest
of its code and closure (``runner.callables``), so a replay made by another function is refused.

A loop of your own (Polygraphy's ``run_check`` and ``sort_artifacts``): ``api.run_check(path, check)`` judges one
file with any checker and returns its ``Verdict``; ``api.sort_artifacts(verdict, paths, artifacts_dir)`` moves files
into ``good/`` or ``bad/`` (``runner.api_loop``).

Errors: a run that starts returns a ``Result`` whatever happens (``ok`` False, ``status`` the
one-line error, ``exit_code`` as the command line's); keys, values or a ``run_dir`` that cannot
start a run raise ``ApiError``. Nothing else is raised but ``KeyboardInterrupt``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from conf import checker_groups
from runner.api_loop import run_check as run_check
from runner.api_loop import sort_artifacts as sort_artifacts
from runner.errors import ApiError as ApiError

Check = Union[str, Callable[[str], bool], None]


def call_registered(artifact: str, key: str) -> bool:
    """The target older runs' configs name for an API callable; ``runner.callables.call``."""
    from runner.callables import call

    return call(artifact, key)


@dataclass(frozen=True)
class Result:
    """A finished run.

    Attributes:
        exit_code: what ``python -m runner`` would exit with (0: the run has its answer; 2: a user
            error or a check that never passed; 3: the answer did not hold as written; 128 + N:
            interrupted by signal N).
        run_dir: the run's directory (``summary.json``, ``replay.json``, ``runner.log``, ``checks/``).
        summary: ``summary.json`` as a dict (``status``, ``checks``, and the mode's fields).
    """

    exit_code: int
    run_dir: Path
    summary: Dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the run ended with its answer (``status`` "ok")."""
        return self.exit_code == 0 and self.summary.get("status") == "ok"

    @property
    def status(self) -> str:
        """``summary.json``'s status: "ok", "interrupted", "check never passed", "answer not verified" or the error."""
        return str(self.summary.get("status", ""))


def _value(value: Any) -> str:
    """``value`` in Hydra's override grammar (strings quoted, so any character is safe)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot pass {type(value).__name__} {value!r} as a config value")


#: keys whose value is one whole value (a dict or list), not a group of keys
WHOLE = {"model_input_shapes", "val_range", "good", "bad", "checker.atol", "checker.rtol", "checker.args"}


def overrides_of(options: Mapping[str, Any], prefix: str = "") -> List[str]:
    """Hydra overrides for keyword ``options``: a dict value is a group of keys (``checker={...}`` ->
    ``checker.rtol=...``) except for keys that take a dict or list as their value (``WHOLE``).

    Raises:
        TypeError: a value that has no config form.
    """
    out: List[str] = []
    for key, value in options.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name not in WHOLE:
            out.extend(overrides_of(value, name + "."))
        else:
            out.append(f"{name}={_value(value)}")
    return out


def _check_overrides(check: Check, registered: List[str]) -> List[str]:
    if check is None:
        return []
    if callable(check):
        from runner.callables import TARGET, register

        key = register(check)
        registered.append(key)
        return ["checker=python", f"checker.target={TARGET}", f"checker.args=[{key}]"]
    if check in checker_groups():  # a checker group's name instead of a command
        return [f"checker={check}"]
    return ["checker=command", f"checker.cmd={_value(check)}"]


def run_composed(
    cfg: Any, directory: Path, summary_out: Optional[Dict[str, Any]] = None, started: Optional[float] = None
) -> int:
    """Run a config composed with Hydra's compose API (``return_hydra_config=True``) in ``directory``,
    as Hydra's ``run_job`` would: the run directory made and set in Hydra's runtime, the task config
    without its ``hydra`` section given to ``runner.run.app.run``.

    Args:
        cfg: the composed config.
        directory: the run directory (made if missing).
        summary_out: filled with the run's summary (``runner.run.app.run``).
        started: when the run started (``time.monotonic``), for ``wall_s`` and ``budget.seconds``; None: now.

    Returns:
        The run's exit code.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from runner.run.app import run

    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(directory)
        cfg.hydra.run.dir = str(directory)  # resolved once: the run's own
        cfg.hydra.job.name = "runner"
    directory.mkdir(parents=True, exist_ok=True)
    task = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])
    HydraConfig.instance().set_config(cfg)
    try:
        return run(task, summary_out, started)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]


def run_mode(mode: str, model: Optional[Union[str, Path]], check: Check = None, **options: Any) -> Result:
    """Run ``mode`` as ``python -m runner mode=MODE model=MODEL ...`` would, in this process.

    Args:
        mode: reduce, precision, layerwise, repeat, build or diff_tactics.
        model: the model file, or None for modes without one.
        check: a command line, a checker's name, or a callable (see the module's docstring).
        options: the command line's keys. ``run_dir=`` names the run directory (default: a fresh
            ``outputs/DATE/TIME-MICROSECONDS-ID``); ``overrides=[...]`` adds raw Hydra overrides.

    Returns:
        The finished run; errors a user can fix are in ``exit_code`` and ``summary["status"]``, as on
        the command line (nothing is raised for them). ``summary`` is this call's own, never that
        of an earlier run in ``run_dir`` (a call refused there has ``ok`` False and the refusal as
        its status).

    Raises:
        ApiError: a key no schema knows, a value of the wrong type or with no config form (the
            command line exits 1 for these), or a ``run_dir`` that exists and is no directory.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from omegaconf import OmegaConf

    import conf
    from runner.callables import release
    from runner.config_keys import register_configs

    run_dir = options.pop("run_dir", None)
    extra = list(options.pop("overrides", []))
    if run_dir is not None:
        _make_run_dir(run_dir)
    registered: List[str] = []
    try:
        try:
            overrides = [f"mode={mode}", *_check_overrides(check, registered), *overrides_of(options), *extra]
        except TypeError as e:
            raise ApiError(str(e)) from None
        if model is not None:
            overrides.append(f"model={_value(str(model))}")
        register_configs()
        if run_dir is not None:
            overrides.append(f"hydra.run.dir={_value(str(Path(run_dir).absolute()))}")
        config_dir = str(Path(conf.__file__).resolve().parent)
        caller = get_gh_backup()  # a program (or test) that initialized Hydra itself gets its state back
        GlobalHydra.instance().clear()
        summary: Dict[str, Any] = {}
        try:
            with initialize_config_dir(config_dir=config_dir, version_base=None, job_name="runner"):
                try:
                    cfg = compose("config", overrides=overrides, return_hydra_config=True)
                except HydraException as e:  # the CLI's one line where it has one (a key of another executor)
                    from runner.__main__ import composition_error

                    raise ApiError(composition_error(e) or " ".join(str(e).split())) from None
                directory = Path(str(OmegaConf.select(cfg, "hydra.run.dir"))).absolute()
                code = run_composed(cfg, directory, summary)
        finally:
            restore_gh_from_backup(caller)
    finally:
        for key in registered:
            release(key)
    return Result(code, directory, summary)


def _make_run_dir(run_dir: Union[str, Path]) -> None:
    """Make ``run_dir`` (and its parents) before the run, so that a folder that cannot be one is a
    one-line ``ApiError`` rather than an ``OSError`` from deep inside.

    Raises:
        ApiError: ``run_dir`` is empty (it would make the working directory the run's), is a file, sits
            under a file, or cannot be made (no permission, a read-only file system).
    """
    if not str(run_dir).strip():
        raise ApiError("run_dir is empty; name a directory for the run, or leave run_dir out for a fresh one")
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ApiError(f"run_dir={run_dir} is a file, or sits under one; name a new or existing directory") from None
    except OSError as e:
        raise ApiError(f"run_dir={run_dir} cannot be made ({e.strerror}); name a writable directory") from None


def reduce(model: Union[str, Path], check: Check, **options: Any) -> Result:
    """``mode=reduce``: the smallest subgraph of ``model`` that still fails ``check``.

    Summary fields: ``reduced_nodes``, ``reduced_inputs``, ``reduced_outputs``, ``output``,
    ``answer_verified``, ``checks``. See ``run_mode`` for ``check`` and ``options``.
    """
    return run_mode("reduce", model, check, **options)


def precision(model: Union[str, Path], check: Check, **options: Any) -> Result:
    """``mode=precision``: the fewest nodes of ``model`` to keep in fp32 for ``check`` to pass.

    Summary fields: ``kept_nodes``, ``kept``, ``total``, ``output``, ``answer_verified``, ``checks``.
    """
    return run_mode("precision", model, check, **options)


def layerwise(model: Union[str, Path], **options: Any) -> Result:
    """``mode=layerwise``: each node's accumulated and introduced error (the compare checker's options).

    Summary fields: ``first_divergence``, ``absorbed``, ``top_introduced``, ``csv``, ``plot``.
    """
    return run_mode("layerwise", model, None, **options)


def repeat(model: Union[str, Path], check: Check, **options: Any) -> Result:
    """``mode=repeat``: run ``check`` on ``model`` until ``until=`` (good, bad or a count).

    Summary fields: ``runs``, ``good``, ``bad``.
    """
    return run_mode("repeat", model, check, **options)
