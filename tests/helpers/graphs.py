"""The planted-fault models of ``examples.planted`` as the precision tests run them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from examples.planted import rmsnorm_decoder

#: the check for ``rmsnorm_decoder_files``: fp16 emulation, the logits judged by relative L2 error
DECODER_CHECK = [
    "checker=compare",
    "checker.backend=fp16_emulation",
    "checker.check_error_stat=rel_l2",
    "checker.rtol=0.01",
]


def rmsnorm_decoder_files(directory: Path, layers: int) -> tuple:
    """``rmsnorm_decoder(layers)`` saved in ``directory``; (its nodes that must stay fp32, the model, and the
    overrides ``model=`` and ``inputs=`` naming the model file and its token ids)."""
    model, needed, ids = rmsnorm_decoder(layers=layers)
    path, inputs = directory / "decoder.onnx", directory / "ids.npz"
    onnx.save(model, path)
    np.savez(inputs, ids=ids)
    return needed, model, [f"model={path}", f"inputs={inputs}"]
