"""fp16/bf16 emulation backend: ONNX Runtime in fp32, with every low-precision tensor rounded.

See ``runner.lowp.emulate`` for the rewrite: each fp16 tensor is rounded to fp16 and each bf16
tensor to bf16 (ONNX Runtime's CPU Cast supports bfloat16 from opset 13). Outputs declared
fp16 come back as float16; outputs declared bf16 as float32 arrays holding bf16-rounded
values, since numpy has no bfloat16 type of its own.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend
from runner.backends.onnxruntime import OnnxRuntimeBackend
from runner.graph.weight_file import is_mapped, maps, weight_bytes, weight_file
from runner.lowp.emulate import emulate_low_precision


class EmulationBackend(Backend):
    """Runs a model as hardware storing its fp16 and bf16 tensors in those precisions would.

    Args:
        providers: ONNX Runtime providers for the fp32 run.
        graph_optimization_level: as for the onnxruntime backend ("disable" unless given; the compare
            checker gives ``checker.graph_optimization_level``).
        provider_options: as for the onnxruntime backend.
        cpu_arena: as for the onnxruntime backend.
    """

    name = "fp16_emulation"
    on_onnxruntime = True

    def __init__(
        self,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        graph_optimization_level: str = "disable",
        provider_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
        cpu_arena: bool = True,
    ):
        self.ort = OnnxRuntimeBackend(
            providers, graph_optimization_level, provider_options=provider_options, cpu_arena=cpu_arena
        )
        self._rewritten: Dict[str, Tuple[onnx.ModelProto, List[str], List[str]]] = {}
        self._kept = 1  # rewritten models held (``keep``)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled without its rewritten models (a large one points into this process's weight file)."""
        state = dict(self.__dict__)
        state["_rewritten"] = {}
        return state

    def prepare(self, model: onnx.ModelProto, key: Optional[str]) -> Tuple[onnx.ModelProto, List[str], List[str]]:
        """The rewritten model and its low-precision inputs and outputs (cached by key)."""
        cached = self._rewritten.get(key) if key is not None else None  # one read: another thread may replace it
        if cached is not None:
            return cached
        rewritten, low_in, low_out, _ = emulate_low_precision(model)
        if not is_mapped(rewritten) and maps(
            weight_bytes(rewritten)
        ):  # kept with its weights in the weight file, not in memory
            rewritten = weight_file().mapped(rewritten) or rewritten
        entry = (rewritten, low_in, low_out)
        if key is not None:  # a new dict, swapped in whole: other threads read the old one meanwhile
            older = [(k, v) for k, v in self._rewritten.items() if k != key][::-1][: self._kept - 1][::-1]
            self._rewritten = {**dict(older), key: entry}
        return entry

    def run(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        key: Optional[str] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        """Run once in fp32 with low-precision rounding; fp16 outputs come back as float16."""
        rewritten, low_in, low_out = self.prepare(model, key)
        fed = {k: (np.asarray(v, dtype=np.float32) if k in low_in else v) for k, v in feeds.items()}
        got = self.ort.run(rewritten, fed, key=None if key is None else f"emu:{key}", outputs=outputs)
        declared = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
        return {
            k: (v.astype(np.float16) if k in low_out and declared.get(k) == onnx.TensorProto.FLOAT16 else v)
            for k, v in got.items()
        }

    def run_as_rounded(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        key: Optional[str] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        """Run an fp32 model that rounds its fp16 tensors itself (``runner.lowp.switchboard``'s) as it
        is, in this backend's sessions: ``run``'s arguments and result, with no rewrite."""
        return self.ort.run(model, feeds, key=key, outputs=outputs)

    def keep(self, models: int) -> None:
        """Hold at least ``models`` rewritten models and their sessions (never fewer than before)."""
        self._kept = max(self._kept, int(models))
        self.ort.keep(models)

    def close(self) -> None:
        """Drop cached sessions and rewritten models."""
        self.ort.close()
        self._rewritten.clear()
