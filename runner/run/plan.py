"""The run's plan: everything the run will read, write and build, taken from the composed config once,
checked, and frozen before any part is built (``runner.run.assembly`` builds the parts from it).

``plan(cfg, overrides)`` reads and checks the config (keys the mode does not use, option pairs that
cannot go together, the executor's keys); ``RunPlan.with_outputs`` gives the plan again with the
output paths the output plan resolved (``runner.files.outputs``). The config the parts read is a read-only
copy (``RunPlan.config``): a part that tries to write into it fails.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from conf import executor_groups, executor_schema
from runner import config as schemas
from runner.config import plain, seconds_limit
from runner.config_keys import (
    check_key_uses,
    check_mode_keys,
    keys_of,
    mode_keys,
    mode_uses,
    set_keys,
)
from runner.context import ITERATIONS_WITH_SAMPLES
from runner.errors import ConfigError
from runner.files.inputs import files_read, same_file
from runner.files.paths import in_job_dir
from runner.graph.model_files import model_files

#: the config keys of the files a run writes that a user can name
OUTPUT_OPTIONS = (
    "output",
    "min_good",
    "artifacts.iter_artifact",
    "summary",
    "replay.save",
    "artifacts.iter_info",
    "save_golden",
    "log_file",
)


@dataclass(frozen=True)
class CheckerPlan:
    """The checker to build.

    Attributes:
        options: the checker group's keys as plain values, ``_target_`` included, the run's own
            (``isolate``, ``timeout_s``) left out.
        isolate: check in a child process (``checker.isolate``).
        timeout_s: seconds an isolated check may take (``checker.timeout_s``), or None.
    """

    options: Mapping[str, Any]
    isolate: bool = False
    timeout_s: Optional[float] = None


@dataclass(frozen=True)
class ExecutorPlan:
    """The executor to build: ``name`` (``executor=``) and the keys its class takes (``options``)."""

    name: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class RunPlan:
    """One run, planned.

    Attributes:
        mode: the mode's name.
        config: the composed config, resolved and read-only (output paths as resolved once
            ``with_outputs`` has run).
        model: ``model=``, or None. model_files: the model and its external data files.
        files_read: ``{path: what it is}`` of every file the run reads (never written).
        checker: the checker, or None for a mode without one. executor: the executor, or None
            for a mode without checks.
        takes_checker: the mode's ``create`` receives the built checker.
        iter_artifact, iter_info: where each iteration's artifact and its info go (None: in the
            run directory, named by the mode).
        outputs_resolved: ``with_outputs`` has run.
    """

    mode: str
    config: DictConfig
    model: Optional[Path]
    model_files: Tuple[Path, ...]
    files_read: Mapping[Path, str]
    checker: Optional[CheckerPlan]
    executor: Optional[ExecutorPlan]
    takes_checker: bool
    outputs_resolved: bool = False

    def get(self, key: str, default: Any = None) -> Any:
        """The value of the dotted ``key`` as plain Python (``default`` when unset or None)."""
        value = OmegaConf.select(self.config, key, default=None)
        return default if value is None else plain(value)

    def requested_outputs(self) -> Tuple[Dict[str, Optional[str | Path]], Dict[str, str]]:
        """``({option: path as given}, {option: default file name})`` for ``runner.files.outputs.plan_outputs``;
        relative ``output`` and ``min_good`` go into a sweep job's own directory."""
        options: Dict[str, Optional[str | Path]] = {}
        for key in OUTPUT_OPTIONS:
            value = OmegaConf.select(self.config, key)
            options[key] = in_job_dir(key, value) if key in ("output", "min_good") else value
        default = in_job_dir("output", self.config.mode.get("default_output"))
        return options, ({"output": default} if default else {})

    def with_outputs(self, resolved: Mapping[str, Optional[Path]]) -> RunPlan:
        """This plan with the output options set to ``resolved`` (``{option: path}``; None keeps an option as it is)."""
        config = OmegaConf.create(OmegaConf.to_container(self.config))  # a writable copy
        assert isinstance(config, DictConfig)
        with open_dict(config):
            for key, path in resolved.items():
                if path is not None:
                    OmegaConf.update(config, key, str(path), merge=False)
        OmegaConf.set_readonly(config, True)
        return dataclasses.replace(self, config=config, outputs_resolved=True)


def _frozen(values: Any) -> DictConfig:
    """``values`` (a mapping) as a read-only ``DictConfig``."""
    config = OmegaConf.create(values)
    assert isinstance(config, DictConfig)
    OmegaConf.set_readonly(config, True)
    return config


def plan(cfg: DictConfig, overrides: Sequence[str] = ()) -> RunPlan:
    """Read and check the run's config; build nothing.

    Args:
        cfg: the composed config.
        overrides: the user's command-line overrides (the keys they set are checked against the mode's).

    Raises:
        ConfigError: a key the mode does not use, ``checker.timeout_s`` without ``checker.isolate``
            or not above 0, ``checker.isolate`` with an executor of worker processes, an executor key
            its class does not take.
    """
    mode = str(cfg.mode.name)
    check_mode_keys(mode, set_keys(overrides))
    config = _frozen(OmegaConf.to_container(cfg, resolve=True))
    check_key_uses(mode, config, overrides)
    _check_iterations(config, overrides)
    _check_loader_bounds(config, overrides)
    _check_rankings(config.get("rankings"))
    checker = checker_plan(config) if config.get("checker") is not None else None
    executor = _executor_plan(config) if mode_uses(mode, "executor") else None
    if checker is not None and checker.isolate and executor is not None and executor.name in ("processes", "dask"):
        raise ConfigError(
            f"checker.isolate=true with executor={executor.name}: its checks already run in worker processes, "
            "where a crash is the worker's; drop one of the two"
        )
    model = config.get("model")
    data = {
        key: OmegaConf.select(config, key)
        for key in ("inputs", "golden", "replay.load", "reference_model", "quantized_model", "rankings")
    }
    modules = [config.get("data_loader"), OmegaConf.select(config, "checker.target")]
    args = OmegaConf.select(config, "checker.args")
    read = files_read(model, data, modules, OmegaConf.select(config, "checker.cmd"), plain(args) if args else ())
    for path in _tactics_read(config):
        read.setdefault(path, "a tactics file diff_tactics reads")
    return RunPlan(
        mode=mode,
        config=config,
        model=Path(model) if model else None,
        model_files=tuple(model_files(model)),
        files_read=_with_cache(read, OmegaConf.select(config, "calibration.cache"), config),
        checker=checker,
        executor=executor,
        takes_checker=bool(config.mode.get("takes_checker")),
    )


def _tactics_read(config: DictConfig) -> List[Path]:
    """The tactics files ``mode=diff_tactics`` reads: ``good=`` and ``bad=``, and those in ``dir=``'s ``good/`` and
    ``bad/`` (none for other modes)."""
    listed = [*(config.get("good") or []), *(config.get("bad") or [])]
    folder = config.get("dir")
    if folder:
        listed += [p for side in ("good", "bad") for p in sorted((Path(str(folder)) / side).glob("*"))]
    return [Path(str(p)).absolute() for p in listed if Path(str(p)).is_file()]


def _with_cache(read: Dict[Path, str], cache: Optional[str], config: DictConfig) -> Dict[Path, str]:
    """``read`` with ``calibration.cache=`` among the files the run reads when it exists (it is read, and so
    never written by another option); refused when it names another file the run reads.

    Raises:
        ConfigError: the cache is the model, its data, the inputs, the loader's script or any other file the
            run reads (also through a link), or names the same path as an output option while it does not
            exist yet (both would write it).
    """
    if not cache:
        return read
    path = Path(cache).absolute()
    for other, what in read.items():
        if same_file(path, other):
            raise ConfigError(
                f"calibration.cache={cache} is {what} ({other}), which this run reads; name a file of its own for "
                "the ranges, e.g. calibration.cache=calibration.json"
            )
    if path.exists():
        return {**read, path: "the calibration.cache= file"}
    for option in OUTPUT_OPTIONS:
        value = OmegaConf.select(config, option)
        if value and same_file(Path(value).absolute(), path):
            raise ConfigError(f"{option} and calibration.cache both name {path}; give them different paths")
    return read


def _check_iterations(config: DictConfig, overrides: Sequence[str]) -> None:
    """``iterations=`` (how many inputs are generated) set beside ``inputs=`` or ``data_loader=``, which give
    their own samples: one line for every value of it, 1 included.

    Raises:
        ConfigError: both set.
    """
    if "iterations" in set_keys(overrides) and (config.get("inputs") or config.get("data_loader")):
        raise ConfigError(ITERATIONS_WITH_SAMPLES)


def _check_loader_bounds(config: DictConfig, overrides: Sequence[str]) -> None:
    """A data loader's bounds (``data_loader_max_samples=``, ``data_loader_max_mb=``) set with no
    ``data_loader=``: they bound nothing, so they are one line, not a key taken and ignored.

    Raises:
        ConfigError: one of them set without a data loader.
    """
    given = [k for k in ("data_loader_max_samples", "data_loader_max_mb") if k in set_keys(overrides)]
    if given and not config.get("data_loader"):
        raise ConfigError(
            f"{given[0]}= bounds what a data_loader= yields, and none is given; drop it, or give data_loader="
        )


def _check_rankings(given: Optional[str]) -> None:
    """``rankings=``: an earlier run's ``ranking.json``, or a run directory holding one.

    Raises:
        ConfigError: no such file, or a folder without a ``ranking.json`` (a run that read nothing would rank
            anew without a word).
    """
    if not given:
        return
    path = Path(str(given))
    if path.is_dir() and not (path / "ranking.json").is_file():
        raise ConfigError(
            f"rankings={given} is a folder without ranking.json; give an earlier precision run's ranking.json or "
            "its run directory"
        )
    if not path.exists():
        raise ConfigError(f"rankings={given}: no such file; give an earlier precision run's ranking.json")


def checker_plan(config: DictConfig) -> CheckerPlan:
    """The checker group's plan (``config.checker``). A checker option left null takes the mode's default
    for it where the mode's keys give one (``checker_defaults`` of its keys dataclass: an int8 precision
    search with TensorRT's placement runs its candidates with ``graph_optimization_level=disable``).

    Raises:
        ConfigError: ``checker.timeout_s`` without ``checker.isolate``, or not above 0.
    """
    options = plain(config.checker)
    for key, value in _mode_checker_defaults(config).items():
        if key in options and options[key] is None:
            options[key] = value
    return checker_plan_of(options)


def checker_plan_of(options: Dict[str, Any]) -> CheckerPlan:
    """The plan of a checker's keys (plain values, ``_target_`` included): ``isolate`` and ``timeout_s`` taken out.

    Raises:
        ConfigError: ``timeout_s`` without ``isolate``, or not above 0.
    """
    options = dict(options)
    if "isolate" not in options:  # a checker that runs a program: its timeout_s is its own
        return CheckerPlan(options)
    isolate = bool(options.pop("isolate"))
    timeout_s = options.pop("timeout_s", None)
    if timeout_s is not None and not isolate:
        raise ConfigError(
            "checker.timeout_s stops a check in its own process: set checker.isolate=true with it (an in-process "
            "check cannot be stopped)"
        )
    return CheckerPlan(options, isolate, seconds_limit(timeout_s, "checker.timeout_s"))


def _mode_checker_defaults(config: DictConfig) -> Dict[str, Any]:
    """The checker options the run's mode defaults: its keys dataclass's ``checker_defaults()``, filled from
    the config (``keys_of``); none for a config without a mode or a mode without them.

    Raises:
        ConfigError: a mode key's value its schema refuses.
    """
    mode = OmegaConf.select(config, "mode.name")
    if mode is None or not hasattr(mode_keys().get(str(mode)), "checker_defaults"):
        return {}
    defaults: Dict[str, Any] = keys_of(str(mode), config).checker_defaults()
    return defaults


#: a group schema's fields that are not its class's keys
_NOT_KEYS = ("_target_", "name")


@functools.cache
def executor_classes() -> Dict[str, type]:
    """``{name: class}`` of every executor of the ``executor`` config group (``conf/executor/*.yaml``, each
    with its schema, whose ``_target_`` names the class): the one place that lists them is the config
    group itself. Read once per process."""
    return {name: get_class(getattr(schemas, executor_schema(name))._target_) for name in executor_groups()}


def _executor_plan(config: DictConfig) -> ExecutorPlan:
    """The executor and its keys, as its schema declares them (a key it does not declare was refused when
    the config was composed: ``executor=serial executor.gpus=[0]``); enums stay enums."""
    name = str(config.executor.name)
    options = {str(k): v if isinstance(v, Enum) else plain(v) for k, v in config.executor.items() if k not in _NOT_KEYS}
    return ExecutorPlan(name, options)
