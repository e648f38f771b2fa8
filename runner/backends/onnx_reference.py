"""The ONNX reference evaluator (onnx.reference.ReferenceEvaluator): slow, but the spec's own semantics."""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from runner.backends.base import Backend
from runner.errors import ModelError
from runner.graph.weight_file import weight_file


class BatchNormalization(OpRun):
    """BatchNormalization in inference mode when the node has one output.

    onnx's reference BatchNormalization for opsets 9-13 switches to training statistics
    whenever a ``momentum`` attribute is present, although a node with a single output is an
    inference node (the spec's training outputs are absent). Exported models often carry
    ``momentum``; the reference evaluator then disagrees with every runtime.
    """

    op_domain = ""

    def _run(
        self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, spatial=None, is_test=None
    ):  # type: ignore[override]
        eps = 1e-5 if epsilon is None else epsilon
        shape = [1, -1] + [1] * (x.ndim - 2)
        y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)
        return (y.astype(x.dtype),)


class OnnxReferenceBackend(Backend):
    """Runs models with ``onnx.reference.ReferenceEvaluator`` (keeps the last evaluator).

    Single-output BatchNormalization nodes run in inference mode (see ``BatchNormalization``).
    """

    name = "onnx_reference"

    def __init__(self) -> None:
        self._cached: Tuple[Optional[str], Optional[ReferenceEvaluator]] = (None, None)

    def run(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        key: Optional[str] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        """Run once; ``outputs`` may name intermediate tensors."""
        try:
            cached_key, evaluator = self._cached  # one read: checks of a parallel run share it
            if key is None or key != cached_key or evaluator is None:
                single_output_bn = all(
                    len(n.output) == 1 for n in model.graph.node if n.op_type == "BatchNormalization"
                )
                evaluator = ReferenceEvaluator(
                    weight_file().portable(model),  # a large model's candidate points into the weight file
                    new_ops=[BatchNormalization] if single_output_bn else None,
                )
                self._cached = (key, evaluator)
            names = list(outputs) if outputs is not None else list(evaluator.output_names)
            got = evaluator.run(names, dict(feeds))
        except Exception as e:  # the evaluator raises many types
            raise ModelError(
                "the ONNX reference evaluator cannot run the model: "
                f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            ) from None
        return {n: np.asarray(v) for n, v in zip(names, got)}
