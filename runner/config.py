"""Config schemas: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files in ``conf/`` only pick values; these schemas make Hydra reject a wrong key,
type or choice before any work begins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

RUN_DIR = "${hydra:runtime.output_dir}"


def seconds_limit(value: Optional[float], key: str) -> Optional[float]:
    """A time limit read from ``key``: None (and infinity, or more than the platform can wait:
    ``threading.TIMEOUT_MAX``, about 292 years) for none, else a positive number of seconds.

    Raises:
        runner.errors.ConfigError: not a number above 0 (NaN, 0, negative).
    """
    import math
    import threading

    from runner.errors import ConfigError

    if value is None:
        return None
    seconds = float(value)
    if math.isnan(seconds) or seconds <= 0:
        raise ConfigError(f"{key}={value}: give a number of seconds above 0 (or null for no limit)")
    return None if seconds >= threading.TIMEOUT_MAX else seconds


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
    int8 = "int8"  # low_precision only: QDQ, calibrated (``runner.lowp.quantize``)
    float8 = "float8"  # low_precision only: Q/DQ to float8e4m3fn as TensorRT deploys fp8 (``runner.lowp.fp8``)


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


class Untie(Enum):
    """How far a tied precision answer is searched block by block (``untie=``): where it pays, to node level, or
    not at all."""

    auto = "auto"
    nodes = "nodes"
    none = "none"


class ShapeInference(Enum):
    """Where reduce's subgraph boundaries get their types and shapes (Polygraphy's loader options)."""

    onnx = "onnx"  # ONNX shape inference, then one ONNX Runtime run for the tensors it leaves without a shape
    none = "none"  # no ONNX inference (--no-shape-inference): what the model declares, the run for the rest
    fallback = "fallback"  # every tensor from the run (--force-fallback-shape-inference): dynamic dims become static


class SignalIs(Enum):
    """What a check command killed by a signal counts as: an error that stops the run, or a failure."""

    error = "error"
    fail = "fail"


@dataclass
class ModeConf:
    """Which strategy drives the lifecycle. ``_target_`` is the mode's ``create``, called with the run
    context, its keys whole (``runner.config_keys.keys_of``) and, by keyword, the checker and the marker."""

    _target_: str = MISSING
    name: str = MISSING
    # its keys dataclass (``module.Class``), read at start-up without importing the mode's module
    # (``runner.config_keys.mode_keys``); None: the module's ``KEYS``
    keys: Optional[str] = None
    default_output: Optional[str] = None  # the file ``output=`` names when unset (reduce, precision)
    takes_checker: bool = False  # the strategy is given the built checker (``checker=``) instead of the lifecycle
    # its candidates may be subgraphs fed any tensor of the model (reduce): every sample keeps every tensor's value
    cuts_tensors: bool = False
    help: str = ""  # its lines in ``--help`` (``runner.terminal.help``)
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
    timeout_s: Optional[float] = None  # with isolate: a check past this many seconds is killed and fails
    on_error: OnError = OnError["stop"]  # the function raises or calls sys.exit: stop (one-line error), fail or pass


@dataclass
class CompareCheckerConf:
    """Runs the candidate in-process and compares its outputs with golden outputs."""

    _target_: str = "runner.checkers.compare.checker.CompareChecker"
    backend: str = "onnxruntime"
    reference: str = "onnxruntime"
    atol: Any = 1e-3  # a number, or {output_name: number, default: number}
    rtol: Any = 1e-3
    max_mismatch_fraction: float = 0.0
    check_error_stat: ErrorStat = ErrorStat.elemwise
    error_quantile: float = 0.5
    on_error: OnError = OnError["fail"]  # a candidate the backend cannot run: fail, pass or stop
    isolate: bool = False  # run each check in a child process: a crash there is a crash verdict, not the run's end
    timeout_s: Optional[float] = None  # with isolate: a check past this many seconds is killed and fails
    low_precision: Optional[Precision] = (
        None  # float16/bfloat16: run fp32 candidates converted (implied by *_emulation)
    )
    providers: List[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    # null: all, but disable for fp16/bf16 emulation (rounding Casts as written) and int8 precision with
    # TensorRT's placement (Q/DQ as written, runner.run.plan)
    graph_optimization_level: Optional[GraphOptimization] = None
    # precision's candidates run on one switched model (runner.checkers.compare.switched): on CPU fp16/bf16
    # (emulated) and int8 (TensorRT's placement); on a device fp16/bf16 at graph_optimization_level=disable
    switchboard: bool = True
    noise_floor: bool = True  # an fp32 candidate failing only by fp32 re-association noise passes
    outputs: List[str] = field(
        default_factory=list
    )  # compare these tensors (any of the model's) instead of the outputs
    exclude_outputs: List[str] = field(default_factory=list)  # leave these graph outputs out
    # judge detections: {boxes: name, scores: name, labels: name, iou: 0.5, score_atol: 0.05, max_unmatched: 0}
    detections: Any = None  # a map (see runner.checkers.compare.detections); null: off
    # {provider: {option: value}}: ONNX Runtime provider options (options of providers not used are ignored).
    # CUDA: cuDNN's default convolution algorithm instead of an exhaustive search per new session (18x
    # cheaper checks on the detector, benchmarks/gpu_checks.py), and no TF32, so fp32 means fp32
    provider_options: Dict[str, Dict[str, Any]] = field(
        default_factory=lambda: {"CUDAExecutionProvider": {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": 0}}
    )
    # precision: a candidate passes within atol/rtol * (1 - margin); null: 0.33 for int8 (Q/DQ), 0 for others
    margin: Optional[float] = None
    # precision: the arithmetics the written answer is judged on at the full tolerance (cpu:disable, cpu:all,
    # cuda:all); null: for int8 both CPU levels and cuda where it runs here, for others none
    verify_on: Optional[List[str]] = None


@dataclass
class ValidateCheckerConf:
    """Fails a candidate whose outputs hold NaN or Inf; no golden outputs (Polygraphy's run --validate)."""

    _target_: str = "runner.checkers.validate.ValidateChecker"
    backend: str = "onnxruntime"
    providers: List[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    outputs: List[str] = field(default_factory=list)  # check these tensors (any of the model's) instead of the outputs
    exclude_outputs: List[str] = field(default_factory=list)  # leave these out
    on_error: OnError = OnError["fail"]  # a candidate the backend cannot run: fail, pass or stop


class Start(Enum):
    """When ``executor=processes`` starts its worker processes: ``lazy`` once a check or job run in the
    runner (after the first) takes a second or more; ``now`` with the run."""

    lazy = "lazy"
    now = "now"


@dataclass
class SerialExecutorConf:
    """One check at a time, in the runner's own thread (the default)."""

    _target_: str = "runner.executors.serial.SerialExecutor"
    name: str = "serial"
    workers: Optional[int] = None  # 1 only: more checks at once need executor=local, processes or dask


@dataclass
class LocalExecutorConf:
    """Several checks at once on this machine, one thread each, each with its GPU from ``gpus``."""

    _target_: str = "runner.executors.local.LocalExecutor"
    name: str = "local"
    workers: Optional[int] = None  # checks at once (default: len(gpus), else this machine's cores)
    gpus: Optional[List[Any]] = None  # GPU ids, one per running check (CUDA_VISIBLE_DEVICES)
    lookahead: bool = True  # build the next round's likely candidates while checks run


@dataclass
class ProcessesExecutorConf:
    """Checks in worker processes on this machine, ``per_gpu`` pinned to each GPU of ``gpus``."""

    _target_: str = "runner.executors.processes.ProcessExecutor"
    name: str = "processes"
    workers: Optional[int] = None  # worker processes (default: len(gpus) * per_gpu, else 2)
    gpus: Optional[List[Any]] = None  # GPU ids; each gets per_gpu workers pinned to it
    per_gpu: int = 1  # worker processes per GPU of gpus
    lookahead: bool = True  # build the next round's likely candidates while checks run
    timeout_s: float = 30.0  # seconds the workers get to start and warm
    local_start: bool = True  # checks run here (threads) until the workers are ready
    start: Start = Start.lazy  # lazy: once a check or job here (after the first) takes 1 s or more; now: at once


@dataclass
class DaskExecutorConf:
    """Checks as tasks on a Dask cluster (``address``); its workers keep the checker's state."""

    _target_: str = "runner.executors.dask.DaskExecutor"
    name: str = "dask"
    address: Optional[str] = None  # the scheduler, tcp://HOST:8786
    workers: Optional[int] = None  # checks at once (default: the cluster's threads)
    gpus: Optional[List[Any]] = None  # GPU ids, one per running check (CUDA_VISIBLE_DEVICES)
    timeout_s: float = 30.0  # seconds to wait for the scheduler
    lookahead: bool = True  # build the next round's likely candidates while checks run


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
# candidates a mode writes, so a replay recorded with other values is not reused (``runner.files.identity``).


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
    verbose: Any = False  # true or 1: debug lines; 2: also ONNX Runtime's own log (Polygraphy's -v, -vv)
    verbosity: List[str] = field(default_factory=list)  # [LEVEL] or [MODULE:LEVEL, ...] (runner.terminal.logs)
    log_format: List[str] = field(default_factory=lambda: ["timestamp"])  # timestamp, line-info, no-colors
    log_file: Optional[str] = None  # every log line also here (runner.log in the run directory has them all)
    quiet: int = 0  # 1: warnings and errors, no progress bar; 2: errors only (runner.terminal.console)
    silent: bool = False  # nothing on the terminal; runner.log and summary.json keep it all
    reuse_run_dir: bool = False  # write into a run directory that holds a finished run (its files are replaced)
    overwrite: bool = False  # an output path you name replaces the file there (else a file no run wrote gets _1)


@dataclass
class CheckedKeys:
    """The checker, and where its checks run, for modes that check candidates."""

    checker: Any = MISSING
    executor: Any = MISSING  # one of the executor schemas above, chosen by executor=


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
    iterations: int = candidate(1)  # generated inputs: how many samples (Polygraphy's --iterations)
    data_loader_max_samples: int = candidate(1000)  # the most samples a data_loader= is read for
    data_loader_max_mb: float = candidate(64.0)  # ... and the most megabytes of input arrays it brings


@dataclass
class CalibrationConf:
    """``calibration.*``: activation ranges for int8, computed once per run from the input samples."""

    method: str = "minmax"  # minmax, entropy, percentile (ONNX Runtime's calibrators)
    samples: Optional[int] = None  # the first N samples of inputs=/data_loader= (null: all)
    percentile: float = 99.999  # method=percentile: the percentile of |value| kept
    cache: Optional[str] = None  # a JSON file of the ranges: read when made from this model, samples and options


@dataclass
class QuantizationConf:
    """``quantization.*``: how int8 QDQ candidates are made (``runner.lowp.quantize``)."""

    per_channel: bool = True  # one scale per output channel of each weight
    symmetric_activations: bool = True  # int8, zero point 0 (TensorRT's int8); false: uint8 with zero points
    op_types_to_quantize: List[str] = field(default_factory=list)  # empty: every op type the quantizer handles
    placement: str = "tensorrt"  # tensorrt: Q/DQ where TensorRT fuses them; onnxruntime: ORT's CPU placement
    # the nodes outside int8: float32, or float16 as TensorRT's --int8 --fp16 (mode=precision: fp32 where needed)
    float_precision: Precision = Precision.float32


@dataclass
class BudgetConf:
    """``budget.*``: when a search stops before its minimal answer, with the best answer it has checked so far."""

    checks: Optional[int] = None  # checks this run may make (replayed verdicts are free); null: no limit
    seconds: Optional[float] = None  # seconds this run may take, from its start; null: no limit


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
class BuilderConf:
    """``builder.*``: TensorRT builder settings for ``mode=build`` (``runner.trt.builder_options``); null/empty:
    TensorRT's default."""

    optimization_level: Optional[int] = None  # 0-5 (--builder-optimization-level)
    tf32: Optional[bool] = None  # --tf32: set (true) or clear (false) BuilderFlag.TF32
    flags: List[str] = field(default_factory=list)  # sparse_weights, refittable, version_compatible, strip_plan, ...
    hardware_compatibility_level: Optional[str] = None  # none, ampere_plus, same_compute_capability
    max_aux_streams: Optional[int] = None
    tactic_sources: Optional[List[str]] = None  # only these: cublas, cublas_lt, cudnn, edge_mask_convolutions, ...
    profiling_verbosity: Optional[str] = None  # layer_names_only, detailed, none
    tiling_optimization_level: Optional[str] = None  # none, fast, moderate, full
    runtime_platform: Optional[str] = None  # same_as_build, windows_amd64
    preview_features: List[str] = field(default_factory=list)  # TensorRT PreviewFeature names to enable


@dataclass
class SaveKeys:
    """Where and how a mode's ONNX result is written."""

    output: Optional[str] = None
    external_data: bool = candidate(False)
    external_data_threshold: Any = candidate(1024)  # bytes; K, M or G suffixes (1M) as Polygraphy takes them
    # the data file output= and min_good= write their tensors to, beside them (default: <name>.data)
    external_data_path: Optional[str] = None


#: what a size suffix multiplies by (Polygraphy's ``--external-data-size-threshold``: powers of 1024)
SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def byte_size(value: Any, option: str) -> int:
    """A size in bytes from a whole number or one with a K, M or G suffix (``1M`` is 1,048,576 bytes).

    Raises:
        ConfigError: anything else (negative, a fraction of a byte, another suffix).
    """
    from runner.errors import ConfigError

    text = str(value).strip().upper().removesuffix("B") if not isinstance(value, bool) else "?"
    number, suffix = (text[:-1], text[-1]) if text[-1:] in SIZE_SUFFIXES else (text, "")
    try:
        size = float(number) * SIZE_SUFFIXES[suffix]
    except ValueError:
        size = -1.0
    if size < 0 or size != int(size):
        raise ConfigError(f"{option}={value}: give a size in bytes, e.g. 1024, 64K, 1M or 2G")
    return int(size)


def data_file_name(value: Any) -> Optional[str]:
    """``external_data_path=`` checked: a file name (it goes beside the model), or None when unset.

    Raises:
        ConfigError: a path with a folder in it, or a name that is no file's.
    """
    from runner.errors import ConfigError

    if value is None or value == "":
        return None
    name = str(value)
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ConfigError(
            f"external_data_path={name}: give a file name, e.g. weights.bin (it goes beside output= and min_good=)"
        )
    if name.lower().endswith(".onnx"):
        raise ConfigError(
            f"external_data_path={name}: a data file named like a model would be taken for one; give it another "
            f"suffix, e.g. {name[:-5]}.bin"
        )
    return name


def answer_options(keys: Any) -> Dict[str, Any]:
    """``save_model``'s options for the models a run answers with (``output=``, ``min_good=``): ``save_options``,
    and with ``external_data_path=`` their data file's name (external data on).

    Raises:
        ConfigError: as ``save_options`` and ``data_file_name``.
    """
    location = data_file_name(getattr(keys, "external_data_path", None))
    return {**save_options(keys), **({"location": location} if location else {})}


def save_options(keys: Any) -> Dict[str, Any]:
    """``save_model``'s ``external_data`` and ``threshold`` (bytes) from a mode's ``SaveKeys``.

    Raises:
        ConfigError: a threshold that is no size (``byte_size``).
    """
    return {
        "external_data": keys.external_data,
        "threshold": byte_size(keys.external_data_threshold, "external_data_threshold"),
    }


def plain(value: Any) -> Any:
    """A config value as plain Python: a DictConfig/ListConfig as dict/list (resolved), an enum as its value."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    return getattr(value, "value", value)
