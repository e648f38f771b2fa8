"""Config schemas: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files in ``conf/`` only pick values; these schemas make Hydra reject a wrong key,
type or choice before any work begins.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields, make_dataclass
from enum import Enum
from pathlib import Path
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
    int8 = "int8"  # low_precision only: QDQ, calibrated (``runner.graph.quantize``)


#: a candidate the compare checker's backend cannot run: fail, pass or stop ("pass" is a keyword, hence
#: the functional form; members are named as users write them)
OnError = Enum("OnError", {"fail": "fail", "pass": "pass", "stop": "stop"})


class ErrorStat(Enum):
    """The statistic ``checker=compare`` judges each output by (Polygraphy's ``--check-error-stat``, and rel_l2)."""

    elemwise = "elemwise"
    max = "max"
    mean = "mean"
    median = "median"
    quantile = "quantile"
    rel_l2 = "rel_l2"


class GraphOptimization(Enum):
    """ONNX Runtime's graph optimization level for candidates."""

    disable = "disable"
    basic = "basic"
    extended = "extended"
    all = "all"


class SignalIs(Enum):
    """What a check command killed by a signal counts as: an error that stops the run, or a failure."""

    error = "error"
    fail = "fail"


@dataclass
class ModeConf:
    """Which strategy drives the lifecycle. ``_target_`` is built with ``instantiate``, given the
    mode's options (the keys its ``create`` names, ``mode_options``) and the run context as keyword arguments."""

    _target_: str = MISSING
    name: str = MISSING
    default_output: Optional[str] = None  # the file ``output=`` names when unset (reduce, precision)
    takes_checker: bool = False  # the strategy is given the built checker (``checker=``) instead of the lifecycle
    help: str = ""  # its lines in ``--help`` (``modes_help``)
    help_order: int = 100  # where ``--help`` lists it


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
    signal_is: SignalIs = SignalIs.error  # a check killed by a signal: error (stop the run) or fail


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
    isolate: bool = False  # run each check in a child process: a crash there is a crash verdict, not the run's end


@dataclass
class CompareCheckerConf:
    """Runs the candidate in-process and compares its outputs with golden outputs."""

    _target_: str = "runner.checkers.compare.CompareChecker"
    backend: str = "onnxruntime"
    reference: str = "onnxruntime"
    atol: Any = 1e-3  # a number, or {output_name: number, default: number}
    rtol: Any = 1e-3
    max_mismatch_fraction: float = 0.0
    check_error_stat: ErrorStat = ErrorStat.elemwise
    error_quantile: float = 0.5
    on_error: OnError = OnError["fail"]  # a candidate the backend cannot run: fail, pass or stop
    isolate: bool = False  # run each check in a child process: a crash there is a crash verdict, not the run's end
    low_precision: Optional[str] = None  # float16/bfloat16: run fp32 candidates converted (implied by *_emulation)
    providers: List[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    graph_optimization_level: GraphOptimization = GraphOptimization.all
    # {provider: {option: value}}: ONNX Runtime provider options (options of providers not used are ignored).
    # CUDA: cuDNN's default convolution algorithm instead of an exhaustive search per new session (18x
    # cheaper checks on the detector, benchmarks/gpu_checks.py), and no TF32, so fp32 means fp32
    provider_options: Dict[str, Dict[str, Any]] = field(
        default_factory=lambda: {"CUDAExecutionProvider": {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": 0}}
    )


@dataclass
class ExecutorConf:
    """Where checks run (``runner/executors/``): ``serial`` (one at a time), ``local`` (``workers``
    threads on this machine, one GPU each from ``gpus``), ``processes`` (worker processes on this
    machine, ``per_gpu`` pinned to each GPU of ``gpus``) or ``dask`` (tasks on the cluster at ``address``)."""

    _target_: str = MISSING
    name: str = MISSING
    # checks at once; local: len(gpus) or the cores; processes: len(gpus) * per_gpu or 2; dask: the cluster's threads
    workers: Optional[int] = None
    gpus: Optional[List[Any]] = None  # GPU ids, one per running check (CUDA_VISIBLE_DEVICES)
    address: Optional[str] = None  # dask: the scheduler, tcp://HOST:8786
    timeout_s: float = 30.0  # dask: seconds to wait for the scheduler; processes: for the workers to start
    per_gpu: int = 1  # processes: worker processes per GPU of gpus
    local_start: bool = True  # processes: checks run here (threads) until the workers are ready
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
    retry_pending: bool = False  # check a candidate that crashed the runner again instead of counting a crash


# -- the keys each mode uses --------------------------------------------------------------------
# The command line stays flat (``direction=``, ``until=``, ``min_good=``). Each mode's module
# (``strategies/<mode>.py``) exports ``KEYS``, the dataclass of the keys it uses, built on the
# shared ones below; ``run_config`` inherits them all. A key set for a mode that does not use it is
# an error naming the modes that do (``check_mode_keys``). Keys marked ``candidate`` change the
# candidates a mode writes, so a replay recorded with other values is not reused (``runner.identity``).


def candidate(default: Any = MISSING, default_factory: Any = MISSING) -> Any:
    """A mode key whose value changes the candidates a mode writes (part of a replay's identity)."""
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata={"candidate": True})
    return field(default=default, metadata={"candidate": True})


@dataclass
class CommonKeys:
    """Keys every mode uses."""

    mode: Any = MISSING
    artifacts: ArtifactsConf = field(default_factory=ArtifactsConf)
    replay: ReplayConf = field(default_factory=ReplayConf)
    summary: str = RUN_DIR + "/summary.json"
    verbose: bool = False
    quiet: int = 0  # 1: warnings and errors, no progress bar; 2: errors only (runner.console)
    silent: bool = False  # nothing on the terminal; runner.log and summary.json keep it all
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
    model_input_shapes: Any = candidate(None)  # {input: [dims]}; validated in runner.graph.feeds
    inputs: Optional[str] = None  # .npz, or polygraphy run --save-inputs JSON (several samples)
    golden: Optional[str] = None  # .npz, or polygraphy run --save-outputs JSON
    save_golden: Optional[str] = None
    seed: int = candidate(0)
    data_loader: Optional[str] = None  # pkg.module.fn returning an iterable of feed dicts
    val_range: Any = None  # generated inputs: [lo, hi] or {input: [lo, hi], default: [lo, hi]}


@dataclass
class CalibrationConf:
    """``calibration.*``: activation ranges for int8, computed once per run from the input samples."""

    method: str = "minmax"  # minmax, entropy, percentile (ONNX Runtime's calibrators)
    samples: Optional[int] = None  # the first N samples of inputs=/data_loader= (null: all)
    percentile: float = 99.999  # method=percentile: the percentile of |value| kept


@dataclass
class QuantizationConf:
    """``quantization.*``: how int8 QDQ candidates are made (ONNX Runtime's QDQ quantizer)."""

    per_channel: bool = True  # one scale per output channel of each weight
    symmetric_activations: bool = True  # int8, zero point 0 (TensorRT's int8); false: uint8 with zero points
    op_types_to_quantize: List[str] = field(default_factory=list)  # empty: every op type the quantizer handles


@dataclass
class QuantKeys:
    """The keys of modes that quantize to int8 (``low_precision=int8``, ``checker.low_precision=int8``)."""

    calibration: CalibrationConf = candidate(default_factory=CalibrationConf)
    quantization: QuantizationConf = candidate(default_factory=QuantizationConf)


@dataclass
class ScopeKeys:
    """Which nodes a search or a report covers (``runner.graph.scope``): regular expressions on node
    names and op types; empty: every node."""

    include_nodes: List[str] = candidate(default_factory=list)
    exclude_nodes: List[str] = candidate(default_factory=list)
    include_op_types: List[str] = candidate(default_factory=list)
    exclude_op_types: List[str] = candidate(default_factory=list)


@dataclass
class SaveKeys:
    """Where and how a mode's ONNX result is written."""

    output: Optional[str] = None
    external_data: bool = candidate(False)
    external_data_threshold: int = candidate(1024)


def _names(cls: type) -> List[str]:
    return [f.name for f in fields(cls)]


def set_keys(overrides: Iterable[str]) -> List[str]:
    """The top-level keys a list of Hydra overrides sets (``+fp16=true`` -> ``fp16``)."""
    return _keys_after("", overrides)


def _keys_after(prefix: str, overrides: Iterable[str]) -> List[str]:
    """The keys right after ``prefix`` (e.g. ``"executor."``) that overrides set, in order, once each."""
    out: List[str] = []
    for text in overrides:
        match = re.match(rf"^[~+]*{re.escape(prefix)}([A-Za-z_][\w-]*)", text)
        if match and match.group(1) not in out:
            out.append(match.group(1))
    return out


def plain(value: Any) -> Any:
    """A config value as plain Python: a DictConfig/ListConfig as dict/list (resolved), an enum as its value."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    return getattr(value, "value", value)


def group_keys(group: str, overrides: Iterable[str]) -> List[str]:
    """The keys of config group ``group`` that Hydra overrides set (``executor.gpus=[0]`` -> ``gpus``)."""
    return _keys_after(group + ".", overrides)


def check_option_keys(group: str, option: str, keys: Iterable[str], options: Mapping[str, Any]) -> List[str]:
    """Check that every key of ``group`` the user set is a parameter of the chosen option's class, and
    return those parameters (the keys to build it with).

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
    return takes(options[option])


def group_targets(group: str) -> Dict[str, str]:
    """``{option name: its _target_}`` of a config group, read from ``conf/<group>/*.yaml``: the group
    is the one list of its options (modes, executors)."""
    from pathlib import Path

    from omegaconf import DictConfig, OmegaConf

    import conf

    found: Dict[str, str] = {}
    for path in sorted((Path(conf.__file__).resolve().parent / group).glob("*.yaml")):
        spec = OmegaConf.load(path)
        if not isinstance(spec, DictConfig):
            continue
        found[str(spec.name)] = str(spec._target_)
    return found


@functools.cache
def mode_keys() -> Dict[str, type]:
    """``{mode name: its keys dataclass}``: each ``conf/mode/<mode>.yaml`` names its strategy's
    ``create`` (``_target_``, ``strategies.<mode>.<Class>.create``), whose module exports ``KEYS``.

    Raises:
        ImportError: a mode's module cannot be imported. AttributeError: it exports no ``KEYS``.
    """
    import importlib

    return {
        name: importlib.import_module(".".join(target.split(".")[:2])).KEYS
        for name, target in group_targets("mode").items()
    }


def run_config() -> type:
    """The top-level schema: every key a user types on the command line, the union of the modes'
    keys (``mode_keys``) and ``CommonKeys``."""
    return make_dataclass("RunConfig", [], bases=(*mode_keys().values(), CommonKeys))


def candidate_options() -> List[str]:
    """The top-level keys marked ``candidate`` in any mode's keys, sorted."""
    return sorted({f.name for cls in mode_keys().values() for f in fields(cls) if f.metadata.get("candidate")})


def mode_uses(mode: str, key: str) -> bool:
    """Whether ``mode`` uses the top-level key ``key`` (its keys dataclass holds it)."""
    return key in _names(mode_keys()[mode])


def check_mode_keys(mode: str, keys: Iterable[str]) -> None:
    """Check that every key the user set is used by ``mode``.

    Args:
        mode: the mode's name (a key of ``mode_keys()``).
        keys: the top-level keys the user set (``set_keys`` of the overrides).

    Raises:
        ConfigError: a key no mode knows (``+fp16=true``), or one the mode does not use, naming
            the modes that do.
    """
    modes = mode_keys()
    used = set(_names(modes[mode])) | set(_names(CommonKeys))
    for key in keys:
        if key == "hydra" or key in used:
            continue
        users = [m for m, cls in modes.items() if key in _names(cls)]
        if not users:
            raise ConfigError(f"{key}= is not an option; see python -m runner --help for the options of each mode")
        raise ConfigError(
            f"{key}= is not used by mode={mode}; it is an option of {', '.join(f'mode={m}' for m in users)}"
        )


def create_parameters(factory: Any) -> List[str]:
    """The keys a mode's ``create`` takes: its parameters but ``ctx`` and the built objects
    (``checker``, ``marker``), which the run passes itself."""
    import inspect

    return [n for n in inspect.signature(factory).parameters if n not in ("ctx", "checker", "marker")]


def mode_options(mode: str, cfg: Any, factory: Any) -> Dict[str, Any]:
    """The options a mode's ``create`` takes, from the config.

    Args:
        mode: the mode's name.
        cfg: the run's config.
        factory: the mode's ``create`` (``cfg.mode._target_``).

    Returns:
        ``{key: value}`` for each parameter of ``factory`` that is a key of the mode, values as plain
        Python (enums by value); the mode's other keys reach it through the run context.

    Raises:
        ConfigError: a parameter of ``factory`` that names no key of the mode (a name that drifted).
    """
    keys = set(_names(mode_keys()[mode]))
    taken = create_parameters(factory)
    stray = [name for name in taken if name not in keys]
    if stray:
        raise ConfigError(f"mode={mode}: its create() takes {stray}, which are not keys of the mode; fix the mode")
    return {name: plain(cfg.get(name)) for name in taken}


def modes_help() -> str:
    """The "Modes" lines of ``--help``, from each mode's YAML (``help``, ``help_order``): a mode added as
    one module and one YAML file is listed with no other change. Registered as the ``${modes_help:}``
    resolver that ``conf/config.yaml``'s help template holds."""
    from omegaconf import DictConfig, OmegaConf

    import conf

    modes = []
    for path in sorted((Path(conf.__file__).resolve().parent / "mode").glob("*.yaml")):
        spec = OmegaConf.load(path)
        if not isinstance(spec, DictConfig):
            continue
        name = str(spec.get("name", path.stem))
        modes.append((int(spec.get("help_order", 100)), name, str(spec.get("help", "")).strip().splitlines() or [""]))
    lines = []
    for _, name, text in sorted(modes):
        lines.append(f"  {name:<13} {text[0]}")
        lines.extend(f"  {'':<13} {more}" for more in text[1:])
    return "\n".join(lines)


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent).

    The group YAML files extend these through their defaults lists, e.g.
    ``conf/checker/command.yaml`` starts with ``defaults: [command_schema]``.
    """
    from omegaconf import OmegaConf

    from runner.rundir import register_resolvers

    register_resolvers()
    OmegaConf.register_new_resolver("modes_help", modes_help, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=run_config())
    cs.store(name="mode_schema", node=ModeConf)
    cs.store(name="marker_schema", node=MarkerConf)
    cs.store(name="command_schema", node=CommandCheckerConf)
    cs.store(name="interactive_schema", node=InteractiveCheckerConf)
    cs.store(name="python_schema", node=PythonCheckerConf)
    cs.store(name="compare_schema", node=CompareCheckerConf)
    cs.store(name="artifacts_schema", node=ArtifactsConf)
    cs.store(name="executor_schema", node=ExecutorConf)
