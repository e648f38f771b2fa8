"""Config schemas: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files in ``conf/`` only pick values; these schemas make Hydra reject a wrong key,
type or choice before any work begins.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

RUN_DIR = "${hydra:runtime.output_dir}"


class Direction(Enum):
    """Which end of the network precision marking starts from (Polygraphy's --direction)."""

    forward = "forward"
    reverse = "reverse"


class Precision(Enum):
    """A floating-point storage type for precision marking."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


@dataclass
class ModeConf:
    """Which strategy drives the lifecycle. ``_target_`` is a ``from_config(cfg)`` factory."""

    _target_: str = MISSING
    name: str = MISSING
    default_output: Optional[str] = None  # the file ``output=`` names when unset (reduce, precision)


@dataclass
class MarkerConf:
    """A pure marker: chooses the next candidate from verdicts (see ``strategies/``)."""

    _target_: str = MISSING
    name: str = MISSING


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
    """Calls a user's function ``target(artifact_path) -> bool`` (True = pass)."""

    _target_: str = "runner.checkers.python.PythonChecker"
    target: str = MISSING


@dataclass
class CompareCheckerConf:
    """Runs the candidate in-process and compares its outputs with golden outputs."""

    _target_: str = "runner.checkers.compare.CompareChecker"
    backend: str = "onnxruntime"
    reference: str = "onnxruntime"
    atol: float = 1e-3
    rtol: float = 1e-3
    max_mismatch_fraction: float = 0.0
    providers: List[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    graph_optimization_level: str = "all"


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


@dataclass
class RunConfig:
    """The top-level config: every key a user types on the command line."""

    mode: Any = MISSING
    marker: Any = MISSING
    checker: Any = MISSING
    artifacts: ArtifactsConf = field(default_factory=ArtifactsConf)
    replay: ReplayConf = field(default_factory=ReplayConf)
    model: Optional[str] = None
    until: Optional[str] = None
    output: Optional[str] = None
    summary: str = RUN_DIR + "/summary.json"
    verbose: bool = False
    # ONNX loading and saving
    model_input_shapes: Any = None  # {input: [dims]}; validated in runner.graph.feeds
    external_data: bool = False
    external_data_threshold: int = 1024
    # reduce
    reduce_inputs: bool = True
    reduce_outputs: bool = True
    min_good: Optional[str] = None
    keep_constant_nodes: bool = False  # default: carried Constant nodes become initializers
    # data for in-process checks
    inputs: Optional[str] = None
    golden: Optional[str] = None
    save_golden: Optional[str] = None
    seed: int = 0
    # precision
    direction: Direction = Direction.forward
    precision: Precision = Precision.float32
    low_precision: Precision = Precision.float16
    weak_typing: bool = False  # TensorRT <= 10: candidates are engines with layer precisions
    # build
    workspace: Optional[int] = None
    timing_cache: Optional[str] = None
    # diff_tactics
    dir: Optional[str] = None
    good: List[str] = field(default_factory=list)
    bad: List[str] = field(default_factory=list)


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
