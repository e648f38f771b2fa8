"""``mode=build``: build a TensorRT engine again and again, check each, sort each tactic record.

The ONNX model is parsed once; every iteration builds a strongly typed engine from the same
network, writes it to the iteration artifact, writes the build's tactic record to
``tactics.json`` in the run directory, and the lifecycle sorts that record (with
``artifacts.paths``) into good/ or bad/ by the check's verdict. ``mode=diff_tactics dir=...``
then names the tactics seen only in bad builds. TensorRT is the optional ``trt`` extra.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

from runner.graph.feeds import check_input_shapes
from runner.graph.load import load_model
from runner.paths import run_dir
from runner.trt import load_tensorrt
from strategies.base import Candidate
from strategies.repeat import RepeatStrategy
from strategies.until import Until

log = logging.getLogger(__name__)


class BuildStrategy(RepeatStrategy):
    """One candidate per build until ``until`` is met (counting as ``mode=repeat`` does).

    Args:
        builder: a ``runner.trt.engine.EngineBuilder`` holding the parsed network.
        until: the stop condition.
        tactics_path: where each build's tactic record is written (then sorted).
    """

    artifact_suffix = ".engine"

    def __init__(self, builder: Any, until: Until, tactics_path: Path):
        super().__init__(until)
        self.builder = builder
        self.tactics_path = Path(tactics_path)

    @classmethod
    def from_config(cls, cfg: Any) -> "BuildStrategy":
        """Parse ``cfg.model`` once with TensorRT.

        Raises:
            MissingExtraError: TensorRT is not installed (names the ``trt`` extra).
            ConfigError: bad ``until`` or shapes. ModelError: bad model or parser failure.
        """
        load_tensorrt("mode=build")
        until = Until.parse(cfg.until, "build")
        model = load_model(cfg.model)
        shapes = check_input_shapes(model, cfg.model_input_shapes)
        from runner.trt.engine import EngineBuilder, profiles_from_shapes

        cache = Path(cfg.timing_cache).read_bytes() if cfg.timing_cache and Path(cfg.timing_cache).is_file() else None
        builder = EngineBuilder(model.SerializeToString(), cfg.workspace, profiles_from_shapes(shapes), cache)
        return cls(builder, until, run_dir(cfg) / "tactics.json")

    def artifacts(self) -> List[Path]:
        """The tactic record, sorted with the check's artifacts."""
        return [self.tactics_path]

    def next_candidate(self) -> Optional[Candidate]:
        """The next build, unless ``until`` was met."""
        if self.done:
            return None
        n = self.runs + 1

        def write(path: Path) -> None:
            result = self.builder.build()
            path.write_bytes(result.engine)
            self.tactics_path.write_text(json.dumps(result.tactics, indent=2))

        return Candidate(key=f"build:{n}", label=f"build {n}", write=write, info={"build": n})

    def result(self) -> Dict[str, Any]:
        """Counts of good and bad builds (``builds`` is ``runs``)."""
        return {**super().result(), "builds": self.runs}
