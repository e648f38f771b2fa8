"""``mode=build``: build a TensorRT engine again and again, check each, sort each tactic record.

The ONNX model is parsed once; every iteration builds a strongly typed engine from the same
network, writes it to the iteration artifact, writes the build's tactic record to
``tactics.json`` in the run directory, and the lifecycle sorts that record (with
``artifacts.paths``) into good/ or bad/ by the check's verdict. With ``executor=local`` each worker
slot builds with its own builder and writes ``tactics_w<slot>.json``. ``mode=diff_tactics dir=...``
then names the tactics seen only in bad builds. TensorRT is the optional ``trt`` extra.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Dict, List

from runner.candidates import Candidate
from runner.context import RunContext
from runner.executors import slot
from runner.files.artifacts import worker_path
from runner.trt import load_tensorrt
from runner.write_guard import check_write
from strategies.mode_keys import BuildKeys
from strategies.until import Until, UntilStrategy

log = logging.getLogger(__name__)


KEYS = BuildKeys


class BuildStrategy(UntilStrategy):
    """One candidate per build until ``until`` is met (counting as ``mode=repeat`` does).

    Args:
        builder: a ``runner.trt.engine.EngineBuilder`` holding the parsed network.
        until: the stop condition.
        tactics_path: where each build's tactic record is written (then sorted).
    """

    artifact_suffix = ".engine"

    def __init__(self, make_builder: Callable[[], Any], until: Until, tactics_path: Path, workers: int = 1):
        super().__init__(until)
        self.make_builder = make_builder
        self.builders: Dict[int, Any] = {0: make_builder()}  # one per worker slot: a builder is not shared
        self.tactics_path = Path(tactics_path)
        self.workers = workers

    @classmethod
    def create(
        cls,
        ctx: RunContext,
        keys: BuildKeys,
        *,
        checker: Any = None,
        marker: Any = None,
    ) -> BuildStrategy:
        """Parse ``ctx.model`` once with TensorRT (``keys``: until, workspace, timing_cache, builder.*).

        Raises:
            MissingExtraError: TensorRT is not installed (names the ``trt`` extra).
            ConfigError: bad ``until``, shapes or ``builder.*`` (checked before TensorRT is looked for).
            ModelError: bad model or parser failure.
        """
        from runner.trt.builder_options import check_builder_options

        options = check_builder_options(keys.builder)  # a misspelt setting is one line, TensorRT or not
        load_tensorrt("mode=build")
        parsed = Until.parse(keys.until, "build")
        workspace, timing_cache = keys.workspace, keys.timing_cache
        from runner.trt.engine import EngineBuilder, profiles_from_shapes

        cache = Path(timing_cache).read_bytes() if timing_cache and Path(timing_cache).is_file() else None
        serialized, profiles = ctx.model.SerializeToString(), profiles_from_shapes(ctx.shapes)
        tactics = ctx.run_dir / ("tactics.json" if ctx.workers <= 1 else "tactics_w{worker}.json")
        return cls(lambda: EngineBuilder(serialized, workspace, profiles, cache, options), parsed, tactics, ctx.workers)

    def artifacts(self) -> List[Path]:
        """The tactic record, sorted with the check's artifacts (one per worker slot: ``{worker}``)."""
        return [self.tactics_path]

    def make(self, n: int) -> Candidate:
        """Build number ``n``: built in its check's worker slot (``write_in_check``), with that slot's builder."""

        def write(path: Path) -> None:
            from runner.trt.execute import use_device

            running = slot.current()
            use_device(running.device)  # build on the slot's GPU, where its check runs the engine
            worker = running.worker
            builder = self.builders.get(worker)
            if builder is None:
                builder = self.builders[worker] = self.make_builder()
            result = builder.build()
            check_write(path, "an engine")
            check_write(worker_path(self.tactics_path, worker), "the engine's tactics")
            path.write_bytes(result.engine)
            worker_path(self.tactics_path, worker).write_text(json.dumps(result.tactics, indent=2))

        return Candidate(key=f"build:{n}", label=f"build {n}", write=write, info={"build": n}, write_in_check=True)

    def result(self) -> Dict[str, Any]:
        """Counts of good and bad builds (``builds`` is ``runs``)."""
        return {**super().result(), "builds": self.counter.runs}
