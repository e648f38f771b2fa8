"""TensorRT backend (optional ``trt`` extra): build a strongly typed engine per candidate and run it.

tensorrt is imported when the backend is created, never at module import; without it the
backend raises MissingExtraError naming the ``trt`` extra.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend
from runner.errors import ModelError
from runner.executors.slot import current
from runner.graph.weight_file import weight_file
from runner.trt import load_tensorrt


class TensorRTBackend(Backend):
    """Builds each candidate into a strongly typed engine (cached by key) and runs it.

    Args:
        workspace: builder workspace limit in bytes, or None.

    Raises:
        MissingExtraError: when TensorRT is not installed.
    """

    name = "tensorrt"

    def __init__(self, workspace: Optional[int] = None):
        load_tensorrt("checker.backend=tensorrt")
        self.workspace = workspace
        self._engine: Optional[Tuple[Optional[str], bytes]] = None

    def run(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        key: Optional[str] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        """Build (or reuse) the engine for ``model`` and run it on ``feeds``; ``outputs`` that are
        not graph outputs are marked as network outputs before the build.

        Raises:
            ModelError: when parsing, building or running fails, or an output names no network tensor.
        """
        from runner.trt.engine import EngineBuilder, profiles_from_shapes
        from runner.trt.execute import run_engine, use_device

        use_device(current().device)  # a parallel check builds and runs on its slot's GPU
        wanted = None if outputs is None else list(outputs)
        ident = None if key is None else f"{key}:{','.join(wanted or [])}"
        cached = self._engine  # read once: checks on other threads replace it
        if cached is not None and ident is not None and cached[0] == ident:
            engine = cached[1]
        else:
            shapes = {k: list(np.shape(v)) for k, v in feeds.items()}
            serialized = weight_file().portable(model).SerializeToString()  # a large candidate gets its values
            builder = EngineBuilder(serialized, self.workspace, profiles_from_shapes(shapes))
            if wanted is not None:
                builder.mark_outputs(wanted)
            engine = builder.build().engine
            self._engine = (ident, engine)
        got = run_engine(engine, feeds)
        if wanted is None:
            return got
        missing = [n for n in wanted if n not in got]
        if missing:
            raise ModelError(f"TensorRT's network has no tensors {missing[:5]} to report (fused or renamed)")
        return {n: got[n] for n in wanted}
