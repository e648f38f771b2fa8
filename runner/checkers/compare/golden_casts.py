"""Golden values for the tensors a low-precision conversion inserts around Casts."""

from __future__ import annotations

from typing import Dict

import numpy as np
import onnx


def through_casts(model: onnx.ModelProto, values: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Give each side of a Cast with no recorded value the other side's value.

    Golden values from an fp32 model lack the tensors an fp16 conversion inserted, which are
    all around Casts: an input Cast's output (``x_cast_to_relu``) and, for graph outputs, the
    renamed producer output that a Cast turns back into the output (``sum_cast_to_y`` -> ``y``).
    A float-to-float Cast's reference value on either side is the same number (Casts to
    integer or bool types are left alone: they change the value).
    """
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    casts = [
        n
        for n in model.graph.node
        if n.op_type == "Cast"
        and any(a.name == "to" and a.i in floats for a in n.attribute)
        and (n.input[0] not in values or np.asarray(values[n.input[0]]).dtype.kind == "f")
    ]
    changed = True
    while changed:
        changed = False
        for node in casts:
            src, dst = node.input[0], node.output[0]
            if dst not in values and src in values:
                values[dst], changed = values[src], True
            elif src not in values and dst in values:
                values[src], changed = values[dst], True
    return values
