"""Config schemas: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files in ``conf/`` only pick values; these schemas make Hydra reject a wrong key,
type or choice before any work begins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Dict, Iterable, List, Mapping, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from runner.errors import ConfigError

RUN_DIR = "${hydra:runtime.output_dir}"


class Direction(Enum):
    """Which end of the network precision marking starts from (Polygraphy's --direction), or
    ``ranked``: prefixes of the nodes ranked by the error each introduces in the low precision."""

    forward = "forward"
    reverse = "reverse"
    ranked = "ranked"


class Precision(Enum):
    """A floating-point storage type for precision marking."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


@dataclass
class ModeConf:
    """Which strategy drives the lifecycle. ``_target_`` is built with ``instantiate``, given the
    mode's options (``MODE_KEYS``) and the run context as keyword arguments."""

    _target_: str = MISSING
    name: str = MISSING
    default_output: Optional[str] = None  # the file ``output=`` names when unset (reduce, precision)
    takes_checker: bool = False  # the strategy is given the built checker (``checker=``) instead of the lifecycle


@dataclass
class MarkerConf:
    """A pure marker: chooses the next candidate from verdicts (see ``strategies/``); built with
    ``instantiate(cfg.marker, _partial_=True)`` into a factory that takes the count."""

    _target_: str = MISSING


@dataclass
class CommandCheckerConf:
    """Runs a shell-free command per iteration (Polygraphy's --check and its options)."""

    _target_: str = "runner.checkers.command.CommandChecker"
    cmd: str = MISSING
    fail_codes: Optional[List[int]] = None
    ignore_fail_codes: Optional[List[int]] = None
    fail_regex: Optional[List[str]] = None
    show_output: bool = False
    hide_fail_output: bool = False
    timeout_s: Optional[float] = None
    signal_is: str = "error"  # a check killed by a signal: error (stop the run) or fail


@dataclass
class InteractiveCheckerConf:
    """Asks the user at the terminal whether each iteration passed."""

    _target_: str = "runner.checkers.interactive.InteractiveChecker"


@dataclass
class PythonCheckerConf:
    """Calls a user's function ``target(artifact_path, *args) -> bool`` (True = pass)."""

    _target_: str = "runner.checkers.python.PythonChecker"
    target: str = MISSING
    args: List[str] = field(default_factory=list)


@dataclass
class CompareCheckerConf:
    """Runs the candidate in-process and compares its outputs with golden outputs."""

    _target_: str = "runner.checkers.compare.CompareChecker"
    backend: str = "onnxruntime"
    reference: str = "onnxruntime"
    atol: Any = 1e-3  # a number, or {output_name: number, default: number}
    rtol: Any = 1e-3
    max_mismatch_fraction: float = 0.0
    check_error_stat: str = "elemwise"  # elemwise, max, mean, median, quantile, rel_l2
    error_quantile: float = 0.5
    on_error: str = "fail"  # a candidate the backend cannot run: fail, pass or stop
    low_precision: Optional[str] = None  # float16/bfloat16: run fp32 candidates converted (implied by *_emulation)
    providers: List[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    graph_optimization_level: str = "all"


@dataclass
class ExecutorConf:
    """Where checks run (``runner/executors/``): ``serial`` (one at a time), ``local`` (``workers``
    at once on this machine, one GPU each from ``gpus``) or ``dask`` (tasks on the cluster at ``address``)."""

    _target_: str = MISSING
    name: str = MISSING
    workers: Optional[int] = None  # checks at once; local: len(gpus) or 2; dask: the cluster's worker threads
    gpus: Optional[List[Any]] = None  # GPU ids, one per running check (CUDA_VISIBLE_DEVICES)
    address: Optional[str] = None  # dask: the scheduler, tcp://HOST:8786
    timeout_s: float = 30.0  # dask: seconds to wait for the scheduler
    lookahead: bool = True  # local, dask: build the next round's likely candidates while checks run


@dataclass
class ArtifactsConf:
    """Artifact policy: what the check produces, and where things are written and sorted."""

    paths: List[str] = field(default_factory=list)
    dir: str = RUN_DIR + "/artifacts"
    iter_artifact: Optional[str] = None
    keep_intermediate: bool = False
    iter_info: Optional[str] = None


@dataclass
class ReplayConf:
    """Debug replay: ``save`` is rewritten after every iteration; ``load`` resumes a run."""

    save: str = RUN_DIR + "/replay.json"
    load: Optional[str] = None
    force: bool = False  # reuse a loaded replay whose identity (model, check, inputs) differs


# -- the keys each mode uses --------------------------------------------------------------------
# The command line stays flat (``direction=``, ``until=``, ``min_good=``); each mode's dataclass
# below names the keys that mode uses, and ``RunConfig`` inherits them all. A key set for a mode
# that does not use it is an error naming the modes that do (``mode_options``).


@dataclass
class CommonKeys:
    """Keys every mode uses."""

    mode: Any = MISSING
    artifacts: ArtifactsConf = field(default_factory=ArtifactsConf)
    replay: ReplayConf = field(default_factory=ReplayConf)
    summary: str = RUN_DIR + "/summary.json"
    verbose: bool = False
    reuse_run_dir: bool = False  # write into a run directory that holds a finished run (its files are replaced)


@dataclass
class CheckedKeys:
    """The checker, and where its checks run, for modes that check candidates."""

    checker: Any = MISSING
    executor: ExecutorConf = field(default_factory=ExecutorConf)


@dataclass
class DataKeys(CheckedKeys):
    """The model and the data in-process checks and shape inference run on."""

    model: Optional[str] = None
    model_input_shapes: Any = None  # {input: [dims]}; validated in runner.graph.feeds
    inputs: Optional[str] = None  # .npz, or polygraphy run --save-inputs JSON (several samples)
    golden: Optional[str] = None  # .npz, or polygraphy run --save-outputs JSON
    save_golden: Optional[str] = None
    seed: int = 0
    data_loader: Optional[str] = None  # pkg.module.fn returning an iterable of feed dicts
    val_range: Any = None  # generated inputs: [lo, hi] or {input: [lo, hi], default: [lo, hi]}


@dataclass
class SaveKeys:
    """Where and how a mode's ONNX result is written."""

    output: Optional[str] = None
    external_data: bool = False
    external_data_threshold: int = 1024


@dataclass
class ReduceKeys(DataKeys, SaveKeys):
    """``mode=reduce``."""

    marker: Any = MISSING
    reduce_inputs: bool = True
    reduce_outputs: bool = True
    min_good: Optional[str] = None
    keep_constant_nodes: bool = False  # default: carried Constant nodes become initializers
    share_weights: bool = True  # large models: candidates reference one weights file written once per run


@dataclass
class PrecisionKeys(DataKeys, SaveKeys):
    """``mode=precision``."""

    marker: Any = MISSING
    direction: Direction = Direction.forward
    precision: Precision = Precision.float32
    low_precision: Precision = Precision.float16
    weak_typing: bool = False  # TensorRT <= 10: candidates are engines with layer precisions


@dataclass
class RepeatKeys(DataKeys):
    """``mode=repeat``."""

    until: Optional[str] = None


@dataclass
class BuildKeys(CheckedKeys):
    """``mode=build``."""

    model: Optional[str] = None
    model_input_shapes: Any = None
    until: Optional[str] = None
    workspace: Optional[int] = None
    timing_cache: Optional[str] = None


@dataclass
class LayerwiseConf:
    """``layerwise.*``: the per-node report."""

    top: int = 10  # nodes in top_introduced and the printed table
    max_memory_mb: Optional[float] = 1024.0  # tensor values held at once; past it, chunks of nodes (null: no limit)
    plot: bool = True  # write layerwise.png


@dataclass
class LayerwiseKeys(DataKeys):
    """``mode=layerwise``."""

    reference_model: Optional[str] = None  # compare with this model instead of the model on checker.reference
    layerwise: LayerwiseConf = field(default_factory=LayerwiseConf)


@dataclass
class DiffTacticsKeys:
    """``mode=diff_tactics``."""

    dir: Optional[str] = None
    good: List[str] = field(default_factory=list)
    bad: List[str] = field(default_factory=list)


#: mode name -> the keys it uses (beyond ``CommonKeys``)
MODE_KEYS: Dict[str, type] = {
    "reduce": ReduceKeys,
    "precision": PrecisionKeys,
    "repeat": RepeatKeys,
    "build": BuildKeys,
    "diff_tactics": DiffTacticsKeys,
    "layerwise": LayerwiseKeys,
}


@dataclass
class RunConfig(ReduceKeys, PrecisionKeys, RepeatKeys, BuildKeys, LayerwiseKeys, DiffTacticsKeys, CommonKeys):
    """The top-level config: every key a user types on the command line (the union of the modes' keys)."""


def _names(cls: type) -> List[str]:
    return [f.name for f in fields(cls)]


def set_keys(overrides: Iterable[str]) -> List[str]:
    """The top-level keys a list of Hydra overrides sets (``+fp16=true`` -> ``fp16``)."""
    out = []
    for text in overrides:
        match = re.match(r"^[~+]*([A-Za-z_][\w-]*)", text)
        if match and match.group(1) not in out:
            out.append(match.group(1))
    return out


def plain(value: Any) -> Any:
    """A config value as plain Python: a DictConfig/ListConfig as dict/list (resolved), an enum as its value."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return getattr(value, "value", value)


def group_keys(group: str, overrides: Iterable[str]) -> List[str]:
    """The keys of config group ``group`` that Hydra overrides set (``executor.gpus=[0]`` -> ``gpus``)."""
    out = []
    for text in overrides:
        match = re.match(rf"^[~+]*{re.escape(group)}\.([A-Za-z_][\w-]*)", text)
        if match and match.group(1) not in out:
            out.append(match.group(1))
    return out


def check_option_keys(group: str, option: str, keys: Iterable[str], options: Mapping[str, Any]) -> None:
    """Check that every key of ``group`` the user set is a parameter of the chosen option's class.

    Args:
        group: the config group, e.g. "executor".
        option: the option chosen (``executor=local``).
        keys: the group's keys the user set (``group_keys``).
        options: ``{option name: its class}`` for every option of the group.

    Raises:
        ConfigError: a key the option's class does not take, naming the options that take it.
    """
    import inspect

    def takes(cls: Any) -> List[str]:
        return [n for n, p in inspect.signature(cls).parameters.items() if p.kind is not p.VAR_KEYWORD]

    allowed = set(takes(options[option])) | {"name", "_target_"}
    for key in keys:
        if key in allowed:
            continue
        users = [name for name, cls in options.items() if key in takes(cls)]
        where = f"; it is an option of {', '.join(f'{group}={u}' for u in users)}" if users else ""
        raise ConfigError(f"{group}.{key}= is not used by {group}={option}{where}")


def mode_uses(mode: str, key: str) -> bool:
    """Whether ``mode`` uses the top-level key ``key`` (its schema in ``MODE_KEYS`` holds it)."""
    return key in _names(MODE_KEYS[mode])


def check_mode_keys(mode: str, keys: Iterable[str]) -> None:
    """Check that every key the user set is used by ``mode``.

    Args:
        mode: the mode's name (a key of ``MODE_KEYS``).
        keys: the top-level keys the user set (``set_keys`` of the overrides).

    Raises:
        ConfigError: a key no mode knows (``+fp16=true``), or one the mode does not use, naming
            the modes that do.
    """
    used = set(_names(MODE_KEYS[mode])) | set(_names(CommonKeys))
    for key in keys:
        if key == "hydra" or key in used:
            continue
        users = [m for m, cls in MODE_KEYS.items() if key in _names(cls)]
        if not users:
            raise ConfigError(f"{key}= is not an option; see python -m runner --help for the options of each mode")
        raise ConfigError(
            f"{key}= is not used by mode={mode}; it is an option of {', '.join(f'mode={m}' for m in users)}"
        )


def mode_options(mode: str, cfg: Any) -> Dict[str, Any]:
    """The mode's own options from the config.

    Returns:
        ``{key: value}`` for each key of the mode's schema except ``checker`` and ``marker``
        (built separately), values as plain Python (enums by value).
    """
    return {
        name: plain(cfg.get(name)) for name in _names(MODE_KEYS[mode]) if name not in ("checker", "marker", "executor")
    }


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent).

    The group YAML files extend these through their defaults lists, e.g.
    ``conf/checker/command.yaml`` starts with ``defaults: [command_schema]``.
    """
    from runner.rundir import register_resolvers

    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=RunConfig)
    cs.store(name="mode_schema", node=ModeConf)
    cs.store(name="marker_schema", node=MarkerConf)
    cs.store(name="command_schema", node=CommandCheckerConf)
    cs.store(name="interactive_schema", node=InteractiveCheckerConf)
    cs.store(name="python_schema", node=PythonCheckerConf)
    cs.store(name="compare_schema", node=CompareCheckerConf)
    cs.store(name="artifacts_schema", node=ArtifactsConf)
    cs.store(name="executor_schema", node=ExecutorConf)
