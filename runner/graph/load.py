"""Load and save ONNX models with clear errors; external data and models over 2 GB supported."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, numpy_helper

from runner.errors import ArtifactError, ModelError, first_line
from runner.graph.isolate import all_graphs
from runner.graph.streamed import load_streamed, save_external, save_streamed
from runner.graph.stubs import nbytes
from runner.graph.weight_file import is_mapped, stored_bytes, weight_bytes, weight_file
from runner.jsonio import UMASK
from runner.terminal.stretch import stretch
from runner.write_guard import check_write

log = logging.getLogger(__name__)

#: models with this many bytes of weights (files of this size) are written (read) piece by piece
#: (``runner.graph.streamed``)
STREAM_BYTES = 64 * 2**20

#: protobuf cannot serialize a message of 2 GiB or more into one string
PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: Optional[str | Path], option: str = "model") -> onnx.ModelProto:
    """Load an ONNX model, with its external data if it has any.

    Args:
        path: the model file.
        option: the config key that named it, for error messages.

    Returns:
        The model.

    Raises:
        ModelError: when no path is given, the file is missing or unreadable, or it is not ONNX.
    """
    if not path:
        raise ModelError(f"no model given; pass {option}=path/to/model.onnx")
    path = Path(path)
    if path.is_dir():
        raise ModelError(f"{option}={path} is a directory; give the model's .onnx file in it")
    if not path.is_file():
        raise ModelError(f"{option}={path}: no such file; check the path")
    if not os.access(path, os.R_OK):
        raise ModelError(f"{option}={path}: the file is not readable; fix its permissions")
    try:
        if path.stat().st_size >= STREAM_BYTES:  # parsed piece by piece: one string of the file would double it
            model = load_streamed(path)
        else:
            model = onnx.load(str(path), load_external_data=False)
        with stretch(f"Reading {path.name}'s external data", weight_bytes(model)):  # said for a large one
            external_data_helper.load_external_data_for_model(model, str(path.parent))
    except (DecodeError, RuntimeWarning, ValueError) as e:
        if "external data" in str(e).lower():  # the model parsed; its data file is short or not its own
            raise ModelError(
                f"{option}={path}: its external data does not hold what the model names ({first_line(e)}); "
                "the data file is truncated or belongs to another model: copy it again beside the model"
            ) from None
        raise ModelError(f"{option}={path}: not an ONNX model ({type(e).__name__}); give a .onnx file") from None
    except FileNotFoundError as e:
        raise ModelError(
            f"{option}={path}: its external data file is missing ({e.filename}); keep the data file beside the model"
        ) from None
    except onnx.checker.ValidationError as e:  # onnx checks external data locations while loading
        first = first_line(e)
        raise ModelError(
            f"{option}={path}: its external data cannot be read ({first}); keep the data file beside the model"
        ) from None
    except OSError as e:
        raise ModelError(f"{option}={path}: cannot be read ({e.strerror}); check the file") from None
    if not model.HasField("graph") or not model.opset_import:
        raise ModelError(f"{option}={path}: not an ONNX model (no graph or no opset); give a .onnx file")
    return model


def fingerprint(model: onnx.ModelProto) -> str:
    """A short identity of a model's node structure (names and op types, in order): 8 hex digits."""
    text = "|".join(f"{n.name}:{n.op_type}" for n in model.graph.node)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Total size in bytes of the model's initializers' raw data (a cheap size estimate)."""
    total = 0
    for init in model.graph.initializer:
        total += len(init.raw_data) if init.HasField("raw_data") else 0
    return total


def is_large(model: onnx.ModelProto) -> bool:
    """True when the model's tensors take 1 GB or more: serializing it in one piece is unsafe."""
    return tensor_bytes(model) >= PROTOBUF_LIMIT // 2


@contextmanager
def as_file(model: onnx.ModelProto) -> Iterator[Path]:
    """Save ``model`` (tensors as external data) into a temporary directory for the ``with`` block.

    For tools that take a path when the model is too large to pass as one protobuf string.

    Raises:
        ArtifactError: when the temporary file cannot be written (the message names ``TMPDIR``, the
            setting that moves it).
    """
    try:
        tmp = tempfile.mkdtemp()
    except OSError as e:
        raise ArtifactError(
            f"cannot make a temporary directory in {tempfile.gettempdir()} ({e.strerror}): set TMPDIR to a writable "
            "directory with room for a copy of the model"
        ) from None
    try:
        try:
            path = save_model(model, Path(tmp) / "model.onnx", external_data=True)
        except ArtifactError as e:
            raise ArtifactError(
                f"cannot write a temporary copy of the model in {tmp} ({str(e).split('(')[-1].rstrip(')')}): "
                "set TMPDIR to a directory with room for it"
            ) from None
        yield path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_model(
    model: onnx.ModelProto,
    path: str | Path,
    external_data: bool = False,
    threshold: int = 1024,
    location: Optional[str] = None,
) -> Path:
    """Save a model; with external data when asked or when it would pass protobuf's 2 GB limit.

    Args:
        model: the model to save (never modified: with external data a copy is written, since
            onnx's external-data writer clears the tensors it moves, and a candidate's model is
            also what an in-process checker runs).
        path: destination file; the external data goes beside it as ``<name>.data``.
        external_data: always write initializers of ``threshold`` bytes or more to the data file.
        threshold: size in bytes from which an initializer goes to the data file.
        location: the data file's name beside ``path`` (``external_data_path=``; external data on), or None for
            ``<name>.data``.

    Returns:
        The path written. It appears whole or not at all: the files are written in a staging
        folder beside it and moved into place (the data file first), so a full disk or a kill
        leaves no partial model under the name; permissions follow the umask.

    Raises:
        ArtifactError: when the file cannot be written (the staging folder is removed).
    """
    path = Path(path)
    external_data = external_data or location is not None
    check_write(path, "a model")
    check_write(path.parent / (location or path.name + ".data"), f"{path.name}'s external data")
    # a mapped model's weights are in this process's temporary weight file: the file written gets them back
    mapped = is_mapped(model)
    size = stored_bytes(model) if mapped else tensor_bytes(model)
    big = size >= PROTOBUF_LIMIT - 64 * 2**20
    if mapped and size < STREAM_BYTES and not (external_data or big):
        model, mapped = weight_file().with_values(model), False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as e:
        raise ArtifactError(f"cannot write {path} ({e.strerror}); choose a writable location") from None
    try:
        staged = staging / path.name
        location = location or path.name + ".data"
        if big and not external_data:
            log.info("%s is over 2 GB: writing its tensors to external data", path)
        if (external_data or big) and mapped:  # file to file, one tensor at a time
            save_external(model, staged, location, threshold)
        elif external_data or big:
            model = _copy(model)
            _to_raw_data(model, threshold)
            _to_external(model, location, threshold)
            onnx.save_model(model, str(staged))  # writes the external tensors beside ``staged``
        elif mapped:  # one tensor's values at a time, read from the weight file as it is written
            save_streamed(model, staged, weight_file().resolved)
        elif sum(nbytes(t) for t in model.graph.initializer) >= STREAM_BYTES:
            save_streamed(model, staged)
        elif any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer):
            onnx.save_model(model, str(staged))  # onnx writes what external tensors hold in memory
        else:  # what onnx.save_model writes, without its walk of every node for external tensors
            staged.write_bytes(model.SerializeToString())
        mode = 0o666 & ~UMASK  # as a file the user's shell makes (onnx writes external data 0600)
        for made in staging.iterdir():
            os.chmod(made, mode)
        data = path.parent / location
        if (staging / location).exists():
            os.replace(staging / location, data)
        elif (external_data or big) and data.exists():
            data.unlink()  # a stale data file of an earlier save under this name
        os.replace(staged, path)  # last: the model appears whole, with its data in place
    except OSError as e:
        raise ArtifactError(f"cannot write {path} ({e.strerror or e}); choose a writable location") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # nothing partial is left
    return path


def copy_model_file(src: Path, dst: Path) -> Path:
    """Copy a model file that holds all its tensors to ``dst``, whole or not at all (as ``save_model``).

    Raises:
        ArtifactError: when ``src`` cannot be read or ``dst`` cannot be written, or ``dst`` is a file a run
            reads (``runner.write_guard``).
    """
    check_write(dst, "a model")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, staged = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
        os.close(fd)
        try:
            shutil.copyfile(src, staged)
            os.chmod(staged, 0o666 & ~UMASK)
            os.replace(staged, dst)
        finally:
            Path(staged).unlink(missing_ok=True)
    except OSError as e:
        raise ArtifactError(f"cannot copy {src} to {dst} ({e.strerror}); choose a writable location") from None
    return dst


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def _to_external(model: onnx.ModelProto, location: str, threshold: int) -> None:
    """Point every initializer of ``threshold`` bytes or more (raw data) at the data file ``location``, to be
    written beside the model by ``onnx.save_model``. onnx's own ``save_as_external_data=True, location=...``
    refuses a location that exists relative to the working folder, not the model's (onnx 1.23): a user's
    ``reduced.onnx.data`` where the run started, or the name this run reserved there, stopped the answer."""
    for graph in all_graphs(model.graph):
        for tensor in graph.initializer:
            if tensor.HasField("raw_data") and len(tensor.raw_data) >= threshold:
                external_data_helper.set_external_data(tensor, location)


def _to_raw_data(model: onnx.ModelProto, threshold: int) -> None:
    """Store large initializers as raw_data: onnx only moves raw_data tensors to external data."""
    for init in model.graph.initializer:
        if not init.HasField("raw_data") and init.data_location != onnx.TensorProto.EXTERNAL:
            array = numpy_helper.to_array(init)
            if array.nbytes >= threshold:
                init.CopyFrom(numpy_helper.from_array(array, init.name))


def _check_proto(path: Path) -> None:
    """``onnx.checker`` on the model file at ``path`` read by Python (its external data not read).

    Raises:
        ModelError: when the checker rejects the model.
    """
    try:
        onnx.checker.check_model(onnx.load(str(path), load_external_data=False))
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{path} does not pass onnx.checker: {first_line(e)}") from None


def check_saved(path: str | Path) -> None:
    """Run ``onnx.checker`` on a saved model (by path, so external data and >2 GB work). onnx's checker takes
    only paths that are UTF-8: a model in a folder whose name is not (a Latin-1 name, as a file system may hold) is
    checked through a link of an ASCII name to its folder, where its external data is too.

    Raises:
        ModelError: when the checker rejects the model.
    """
    path = Path(path)
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        with tempfile.TemporaryDirectory(prefix="runner-check-") as tmp:
            folder = Path(tmp) / "folder"
            folder.symlink_to(path.parent.absolute(), target_is_directory=True)
            try:
                path.name.encode("utf-8")
            except UnicodeEncodeError:  # the file's own name too: its graph, read here, without external data
                return _check_proto(path)
            return check_saved(folder / path.name)
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        first = first_line(e)
        raise ModelError(f"{path} does not pass onnx.checker: {first}") from None
