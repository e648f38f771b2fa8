"""Weights written once per run and referenced by every candidate, instead of re-serialised each check.

Reduce's candidates hold the original initializers unchanged, so the large ones are written once
to one file in ONNX's external-data layout (raw little-endian bytes at an offset), and the model
the candidates are cut from carries references to it instead of the bytes ("stubs"). A candidate
file is then just its graph; a check reads the weights it needs from the shared file, as any ONNX
consumer reads external data (paths relative to the model file). In-process checkers and the final
outputs get the bytes back with ``load_into``.
"""

from __future__ import annotations

import contextlib
import filecmp
import logging
import os
import shutil
from pathlib import Path
from typing import Dict, Iterable, Set, Tuple

import onnx
from onnx import external_data_helper, numpy_helper

from runner.errors import ArtifactError
from runner.graph.stubs import raw_bytes

log = logging.getLogger(__name__)

#: initializers of this many bytes or more go to the shared file
TENSOR_THRESHOLD = 1024
#: models whose initializers take fewer bytes are written whole each check (the saving would not matter)
MODEL_THRESHOLD = 64 * 2**20
#: the TensorProto fields that hold a tensor's values
DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's initializers (raw data, or as numpy arrays when stored in typed fields)."""
    return sum(
        len(t.raw_data) if t.HasField("raw_data") else numpy_helper.to_array(t).nbytes for t in model.graph.initializer
    )


def _new_file(directory: Path, names: Set[str]) -> Path:
    """Create (empty, exclusively) the first of ``weights.bin``, ``weights_1.bin``, ... in ``directory``
    that is not in ``names`` and does not exist.

    Raises:
        ArtifactError: when ``directory`` cannot be written.
    """
    n = 0
    while True:
        path = directory / ("weights.bin" if n == 0 else f"weights_{n}.bin")
        n += 1
        if path.name in names:
            continue
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise ArtifactError(f"cannot write the shared weights in {directory} ({e.strerror})") from None


class SharedWeights:
    """The large initializers of a model in one file, and stubs that reference them.

    Args:
        model: the model (not modified).
        directory: where the weights file is written: ``weights.bin``, or ``weights_N.bin`` when a
            file there or one of ``taken`` has that name (stubs reference it by name, so it must
            differ from the model's own files: an artifact may be written beside them). An
            existing file is never written.
        taken: the model's files (the model and its external data).
        threshold: initializers of this many bytes or more are shared.

    Attributes:
        path: the weights file.

    Raises:
        ArtifactError: when the file cannot be written.
    """

    def __init__(
        self, model: onnx.ModelProto, directory: Path, taken: Iterable[Path] = (), threshold: int = TENSOR_THRESHOLD
    ):
        self.path = _new_file(Path(directory), {Path(p).name for p in taken})
        self.table: Dict[str, Tuple[int, int]] = {}
        self._placed: Set[Path] = {self.path.resolve()}  # copies this run made or proved identical
        try:
            with open(self.path, "wb") as f:
                for tensor in model.graph.initializer:
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:
                        continue
                    data = raw_bytes(tensor)
                    if len(data) >= threshold:
                        self.table[tensor.name] = (f.tell(), len(data))
                        f.write(data)
        except OSError as e:
            with contextlib.suppress(OSError):
                self.path.unlink()  # nothing partial is left
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
                tensor.raw_data = raw_bytes(tensor)  # onnx sets external data only on raw_data tensors
            external_data_helper.set_external_data(tensor, self.path.name, offset=entry[0], length=entry[1])
            for field in DATA_FIELDS:
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
        return out

    def place(self, directory: Path) -> None:
        """Make the weights file reachable from models saved in ``directory``: a copy, made once (onnx
        refuses external data with several hard links, and links out of the directory). A file of
        that name already there is used only when its bytes are the weights' (a resumed run's
        copy); any other is left alone.

        Raises:
            ArtifactError: when the copy cannot be made, or another file has its name there.
        """
        target = (Path(directory) / self.path.name).resolve()
        if target in self._placed:
            return
        if target.exists():
            if not filecmp.cmp(target, self.path, shallow=False):
                raise ArtifactError(
                    f"{target} exists and is not this run's shared weights file; it is left alone: write the "
                    "iteration artifacts elsewhere (artifacts.iter_artifact=) or run with share_weights=false"
                )
        else:
            try:
                with open(self.path, "rb") as src, open(target, "xb") as dst:
                    shutil.copyfileobj(src, dst)
            except OSError as e:
                with contextlib.suppress(OSError):
                    target.unlink()
                raise ArtifactError(
                    f"cannot place the shared weights in {directory} ({e.strerror}); check the directory"
                ) from None
        self._placed.add(target)

    def load_into(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of a stub model with the shared bytes read back (for in-process runs and final outputs)."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        external_data_helper.load_external_data_for_model(out, str(self.path.parent))
        return out
