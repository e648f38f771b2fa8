"""Concrete dtype and shape of every tensor: ONNX shape inference first, ONNX Runtime as fallback."""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper

from runner.errors import ModelError, first_line
from runner.graph.load import as_file, is_large
from runner.graph.stubs import weightless
from runner.graph.summaries import TensorSummary
from runner.graph.weight_file import maps, weight_bytes

log = logging.getLogger(__name__)

Meta = Tuple[np.dtype, List[int]]


def _with_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        if vi.name in input_shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in input_shapes[vi.name]:
                dims.add().dim_value = int(d)
    return fixed


def _complete(vi: onnx.ValueInfoProto) -> Optional[Meta]:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if tt.elem_type == onnx.TensorProto.UNDEFINED or not tt.HasField("shape"):
        return None
    if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in tt.shape.dim):
        return None
    return np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), [int(d.dim_value) for d in tt.shape.dim]


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference; past 1 GB of tensors it runs on files (protobuf's 2 GB limit).

    Args:
        model: the model (not modified).

    Returns:
        A copy of ``model`` with inferred ``value_info`` and output types. For large models only
        the top-level graph's are filled in (If/Loop bodies keep what they declared).

    Raises:
        Exception: whatever onnx's inference raises (InferenceError and others).
    """
    if not is_large(model):
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    with as_file(model) as src:
        dst = src.with_name("inferred.onnx")
        onnx.shape_inference.infer_shapes_path(str(src), str(dst), strict_mode=False, data_prop=True)
        inferred = onnx.load(str(dst), load_external_data=False)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for field in ("value_info", "output"):
        del getattr(out.graph, field)[:]
        getattr(out.graph, field).extend(getattr(inferred.graph, field))
    return out


class TensorMeta:
    """Dtype and concrete shape of the model's top-level tensors.

    Shape inference runs on a copy of the model whose inputs carry ``input_shapes``; tensors it
    leaves incomplete are filled from ONNX Runtime's summaries of every tensor (``summaries()``,
    e.g. ``RunContext.summaries``, streamed in bounded memory), asked for only then.

    Args:
        model: the model (not modified).
        input_shapes: ``{input: [dims]}`` from ``model_input_shapes=``.
        summaries: returns ``{tensor name: TensorSummary}`` of one run (called at most once, only
            when shapes are missing); may raise ModelError. None: no run; tensors inference leaves
            without a static shape are left out.
        inference: ``shape_inference=`` (Polygraphy's loader options): "onnx" (ONNX shape inference, ONNX
            Runtime's run for what it leaves), "none" (no ONNX inference, ``--no-shape-inference``: what the model
            declares, the run for the rest) or "fallback" (every tensor from the run,
            ``--force-fallback-shape-inference``: dynamic dimensions become the run's).

    Attributes:
        meta: ``{tensor name: (numpy dtype, [dims])}``.
        fallback_error: why the fallback run failed, or None.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        input_shapes: Mapping[str, Sequence[int]],
        summaries: Optional[Callable[[], Mapping[str, TensorSummary]]],
        inference: str = "onnx",
    ):
        self.meta: Dict[str, Meta] = {}
        self.fallback_error: Optional[str] = None
        # a large model's weights are stubs here: inference reads their types and dims, and a copy of
        # them would cost their size (small initializers, which shape inputs are, keep their values)
        source = weightless(model)[0] if maps(weight_bytes(model)) else model
        fixed = _with_input_shapes(source, input_shapes)
        inferred = fixed
        if inference == "onnx":
            try:
                inferred = infer_shapes(fixed)
            except Exception as e:  # onnx raises InferenceError and others
                log.info("ONNX shape inference failed (%s); falling back to ONNX Runtime", first_line(e))
        g = inferred.graph
        declared = list(g.input) if inference == "fallback" else list(g.input) + list(g.value_info) + list(g.output)
        for vi in declared:
            m = _complete(vi)
            if m is not None:
                self.meta[vi.name] = m
        wanted = [o for n in model.graph.node for o in n.output if o]
        missing = [name for name in wanted if name not in self.meta]
        if missing and summaries is not None:
            how = {"onnx": "after inference", "none": "declared (shape_inference=none)"}.get(inference)
            log.info(
                "%d of %d tensors %s; running ONNX Runtime once",
                len(missing),
                len(wanted),
                f"have no static shape {how}" if how else "from ONNX Runtime's run (shape_inference=fallback)",
            )
            try:
                found = summaries()
            except ModelError as e:
                self.fallback_error = str(e)
                log.warning("Shape fallback failed: %s", e)
            else:
                for name in missing:
                    summary = found.get(name)
                    if summary is not None:
                        self.meta[name] = (summary.dtype, list(summary.shape))

    def get(self, name: str) -> Optional[Meta]:
        """The tensor's (dtype, shape), or None when unknown."""
        return self.meta.get(name)


def value_sizes(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]],
    summaries: Optional[Callable[[], Mapping[str, TensorSummary]]],
) -> Dict[str, int]:
    """Bytes of each top-level tensor's values in one run (``TensorMeta``: shape inference, ONNX
    Runtime's summaries where it falls short): what a layerwise comparison's chunks are sized by.

    Args:
        model: the model (not modified).
        input_shapes: ``{input: [dims]}`` of the run's feeds.
        summaries: as ``TensorMeta``'s (called only when shapes are missing; None: no run).

    Returns:
        ``{tensor name: bytes}``; tensors whose shape stays unknown are left out.
    """
    meta = TensorMeta(model, input_shapes, summaries)
    return {
        name: int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        for name, (dtype, shape) in meta.meta.items()
    }
