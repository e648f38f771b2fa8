"""Weights written once per run and referenced by every candidate, instead of re-serialised each check.

Reduce's candidates hold the original initializers unchanged, so the large ones are written once
to one file in ONNX's external-data layout (raw little-endian bytes at an offset), and the model
the candidates are cut from carries references to it instead of the bytes ("stubs"). A candidate
file is then just its graph; a check reads the weights it needs from the shared file, as any ONNX
consumer reads external data (paths relative to the model file). In-process checkers and the final
outputs get the bytes back with ``load_into``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Dict, Tuple

import onnx
from onnx import external_data_helper, numpy_helper

from runner.errors import ArtifactError

log = logging.getLogger(__name__)

#: initializers of this many bytes or more go to the shared file
TENSOR_THRESHOLD = 1024
#: models whose initializers take fewer bytes are written whole each check (the saving would not matter)
MODEL_THRESHOLD = 64 * 2**20
#: the TensorProto fields that hold a tensor's values
DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def _raw(tensor: onnx.TensorProto) -> bytes:
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    return numpy_helper.to_array(tensor).tobytes()


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's initializers (raw data, or as numpy arrays when stored in typed fields)."""
    return sum(
        len(t.raw_data) if t.HasField("raw_data") else numpy_helper.to_array(t).nbytes for t in model.graph.initializer
    )


class SharedWeights:
    """The large initializers of a model in one file, and stubs that reference them.

    Args:
        model: the model (not modified).
        path: the weights file to write (its name is what stubs reference).
        threshold: initializers of this many bytes or more are shared.

    Raises:
        ArtifactError: when the file cannot be written.
    """

    def __init__(self, model: onnx.ModelProto, path: Path, threshold: int = TENSOR_THRESHOLD):
        self.path = Path(path)
        self.table: Dict[str, Tuple[int, int]] = {}
        try:
            with open(self.path, "wb") as f:
                for tensor in model.graph.initializer:
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:
                        continue
                    data = _raw(tensor)
                    if len(data) >= threshold:
                        self.table[tensor.name] = (f.tell(), len(data))
                        f.write(data)
        except OSError as e:
            raise ArtifactError(
                f"cannot write the shared weights file {self.path} ({e.strerror}); free some space"
            ) from None
        log.info(
            "Wrote %d initializers (%d bytes) once to %s; candidates reference them",
            len(self.table),
            self.path.stat().st_size,
            self.path,
        )

    def stub(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` whose shared initializers reference the weights file instead of holding bytes."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        for tensor in out.graph.initializer:
            entry = self.table.get(tensor.name)
            if entry is None:
                continue
            if not tensor.HasField("raw_data"):
                tensor.raw_data = _raw(tensor)  # onnx sets external data only on raw_data tensors
            external_data_helper.set_external_data(tensor, self.path.name, offset=entry[0], length=entry[1])
            for field in DATA_FIELDS:
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
        return out

    def place(self, directory: Path) -> None:
        """Make the weights file reachable from models saved in ``directory``: a copy, made once (onnx
        refuses external data with several hard links, and links out of the directory).

        Raises:
            ArtifactError: when the copy cannot be made.
        """
        target = Path(directory) / self.path.name
        if target.resolve() == self.path.resolve() or (
            target.exists() and target.stat().st_size == self.path.stat().st_size
        ):
            return
        try:
            shutil.copyfile(self.path, target)
        except OSError as e:
            raise ArtifactError(
                f"cannot place the shared weights in {directory} ({e.strerror}); check the directory"
            ) from None

    def load_into(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of a stub model with the shared bytes read back (for in-process runs and final outputs)."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        external_data_helper.load_external_data_for_model(out, str(self.path.parent))
        return out
