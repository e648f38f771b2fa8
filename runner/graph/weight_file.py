"""One file of weights per process that ONNX Runtime sessions of large models map instead of copying.

A session made from a serialized model copies every weight twice (the protobuf string, then ONNX
Runtime's own tensors) and pre-packs MatMul weights into a third copy: a 212 MB decoder's session
took 640 MB beside the loaded model. A session made from a model whose weights are external data
maps the data file and reads it in place (ONNX Runtime memory-maps external data on CPU), so a
session costs what it computes. Each distinct tensor is written once (keyed by a digest of its
bytes): the original weights, their fp16 or int8 forms, and a kept node's fp32 copy are shared by
every candidate that holds them. ``benchmarks/memory.py`` measures the effect.

The file lives in a temporary directory (``TMPDIR``), is removed when the process exits, and is
never a user's artifact: models written for users get their values back (``with_values``).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import onnx
from onnx import TensorProto

from runner.errors import ModelError
from runner.graph.stubs import nbytes, raw_bytes, weightless

log = logging.getLogger(__name__)

#: models holding this many bytes of weights get sessions that map the weight file
MAP_BYTES = 64 * 2**20

#: initializers of this many bytes or more go to the file; smaller ones stay in the model
POINT_BYTES = 64 * 2**10

#: how the data file's name (the ``location`` of every tensor pointed into it) begins; the rest is the
#: process id and a random part, so that a mapped model that reaches another process (a pickled
#: cache) fails to load there instead of reading that process's file
FILE_PREFIX = "runner-weights-"

#: tensors start on page boundaries, so ONNX Runtime can map each one
ALIGN = 4096


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's top-level weights, in the model or pointed into a weight file."""
    total = 0
    for init in model.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL:
            total += int(next((e.value for e in init.external_data if e.key == "length"), 0))
        else:
            total += nbytes(init)
    return total


def maps(nbytes: int) -> bool:
    """Whether a model holding ``nbytes`` bytes of weights gets sessions that map them (``MAP_BYTES``)."""
    return nbytes >= MAP_BYTES


def is_mapped(model: onnx.ModelProto) -> bool:
    """Whether some of ``model``'s initializers point into a weight file (``runner.graph.weight_file``)."""
    return any(is_pointed(init) for init in model.graph.initializer)


def stored_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's top-level initializers' raw data, those pointed into a weight file included."""
    total = 0
    for init in model.graph.initializer:
        if is_pointed(init):
            total += int(next((e.value for e in init.external_data if e.key == "length"), 0))
        elif init.HasField("raw_data"):
            total += len(init.raw_data)
    return total


def is_pointed(init: TensorProto) -> bool:
    """Whether ``init`` holds its values in a weight file."""
    return (_location(init) or "").startswith(FILE_PREFIX)


def _location(init: TensorProto) -> Optional[str]:
    if init.data_location != TensorProto.EXTERNAL:
        return None
    return next((e.value for e in init.external_data if e.key == "location"), None)


#: the most bytes one ``os.pread`` is asked for (Linux returns at most 0x7ffff000 a call)
READ_CHUNK = 1 << 30


def read_exactly(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes of the open file ``fd`` from ``offset``, in ``READ_CHUNK`` reads.

    Raises:
        OSError: a read fails, or the file ends first.
    """
    if length <= READ_CHUNK:
        data = os.pread(fd, length, offset)
        if len(data) == length:
            return data
    buffer = bytearray(length)
    view = memoryview(buffer)
    done = 0
    while done < length:
        got = os.preadv(fd, [view[done : done + READ_CHUNK]], offset + done)
        if got <= 0:
            raise OSError(f"the weight file ends {length - done} bytes short of a tensor's end")
        done += got
    return bytes(buffer)


class WeightFile:
    """An append-only file of tensor bytes, each distinct content written once, in a temporary folder.

    Thread-safe. Writing stops for good on the first error (a full disk): ``point`` then returns
    False and callers give ONNX Runtime the values themselves, as before.
    """

    def __init__(self) -> None:
        self.directory: Optional[Path] = None
        self.name = f"{FILE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.bin"
        self._index: Dict[bytes, Tuple[int, int]] = {}
        # (id of a source tensor, tag): (the source, where its form is); the source is held, so its id
        # names it while it is here. A tensor pointed again costs no read and no digest of its bytes
        # (a 2.8 GB model's sessions hashed 14 s of weights per run)
        self._sources: Dict[Tuple[int, str], Tuple[TensorProto, Tuple[int, int]]] = {}
        self._digests: Dict[int, Tuple[TensorProto, bytes]] = {}
        self._size = 0
        self._lock = threading.Lock()
        self._broken = False
        self._sessions = 0

    def _open(self) -> Path:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="runner-weights-"))
            atexit.register(shutil.rmtree, self.directory, True)
        return self.directory

    def put(self, data: bytes, digest: Optional[bytes] = None) -> Optional[Tuple[int, int]]:
        """(offset, length) in bytes of ``data`` in the file, written now unless it is there already;
        None when the file cannot be written (logged once, with the fix).

        ``digest`` names the content when the caller knows it (a digest of what ``data`` was made
        from, with what made it); by default the SHA-1 of ``data``."""
        if digest is None:
            digest = hashlib.sha1(data, usedforsecurity=False).digest()
        with self._lock:
            if digest in self._index:
                return self._index[digest]
            if self._broken:
                return None
            try:
                path = self._open() / self.name
                offset = -(-self._size // ALIGN) * ALIGN
                with open(path, "ab") as f:
                    f.write(b"\0" * (offset - self._size))
                    f.write(data)
            except OSError as e:
                self._broken = True
                log.warning(
                    "cannot write the weight file in %s (%s): sessions copy their weights from now on, "
                    "which takes more memory; set TMPDIR to a folder with room for twice the model",
                    tempfile.gettempdir(),
                    e.strerror,
                )
                return None
            self._size = offset + len(data)
            self._index[digest] = (offset, len(data))
            return self._index[digest]

    def point(
        self, init: TensorProto, source: TensorProto, make: Optional[Callable[[bytes], bytes]] = None, tag: str = ""
    ) -> bool:
        """Point the stub ``init`` at ``source``'s values in the file, in place.

        Args:
            init: a stub (name, type, dims) in the model that will run.
            source: the tensor holding the values.
            make: what turns ``source``'s bytes into ``init``'s (e.g. fp16 widened to fp32); run
                only when the file does not hold its result yet.
            tag: names what ``make`` does; with the source's digest, the key of its result.

        Returns:
            False when the file cannot be written (``init`` is left a stub).
        """
        where = self.form(source, make, tag)
        if where is None:
            return False
        self.refer(init, where)
        return True

    def form(
        self, source: TensorProto, make: Optional[Callable[[bytes], bytes]] = None, tag: str = ""
    ) -> Optional[Tuple[int, int]]:
        """(offset, length) in bytes of ``source``'s values in the file (made by ``make`` when given, ``tag``
        naming what it does), written now unless they are there already; None when the file cannot be written.

        A source seen before (the same tensor object, which the file then holds) is found without reading its
        bytes; a new one is known by the SHA-1 of its bytes, so equal tensors share one copy.
        """
        key = (id(source), tag)
        with self._lock:
            seen = self._sources.get(key)
        if seen is not None and seen[0] is source:
            return seen[1]
        with self._lock:
            known = self._digests.get(id(source))
        data: Optional[bytes] = None
        if known is not None and known[0] is source:
            digest = known[1]
        else:  # a new tensor: its bytes read once, for the digest and for the file
            data = raw_bytes(source)
            digest = hashlib.sha1(data, usedforsecurity=False).digest()
            with self._lock:
                self._digests[id(source)] = (source, digest)
        digest += tag.encode()
        with self._lock:
            where = self._index.get(digest)
        if where is None:
            data = raw_bytes(source) if data is None else data
            where = self.put(make(data) if make is not None else data, digest)
        if where is not None:
            with self._lock:
                self._sources[key] = (source, where)
        return where

    def where_of(self, init: TensorProto) -> Tuple[int, int]:
        """``where`` ((offset, length) in bytes) of a tensor pointed into the file.

        Raises:
            ModelError: it points into another process's weight file.
        """
        fields = {e.key: e.value for e in init.external_data}
        location = fields.get("location")
        offset, length = int(fields["offset"]), int(fields["length"])
        if location == self.name:
            return offset, length
        raise ModelError(f"tensor {init.name} points into another process's weight file; please report it")

    def refer(self, init: TensorProto, where: Tuple[int, int]) -> None:
        """Point the stub ``init`` at the bytes at ``where`` ((offset, length) from ``put``), in place."""
        init.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.name), ("offset", str(where[0])), ("length", str(where[1]))):
            entry = init.external_data.add()
            entry.key, entry.value = key, value

    def portable(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """``model`` as another process can run it: a mapped one with its values back (``with_values``;
        the weight file is this process's), any other as it is."""
        return self.with_values(model) if is_mapped(model) else model

    def holds(self, model: onnx.ModelProto) -> bool:
        """Whether every initializer of ``model`` that points into a weight file points into this one
        (a mapped model made in another process does not load here)."""
        return all(_location(i) == self.name for i in model.graph.initializer if is_pointed(i))

    def read(self, where: Tuple[int, int]) -> bytes:
        """The bytes at ``where`` ((offset, length) from ``put``), whole whatever their size: one ``pread`` returns
        at most 0x7ffff000 bytes on Linux (a 7B decoder's 2.18 GB embedding came back short), so it is read in
        ``READ_CHUNK`` pieces into one buffer.

        Raises:
            OSError: when the file cannot be read, or ends before ``where`` does.
        """
        assert self.directory is not None
        fd = os.open(self.directory / self.name, os.O_RDONLY)
        try:
            return read_exactly(fd, where[0], where[1])
        finally:
            os.close(fd)

    def copy_to(self, where: Tuple[int, int], fd: int, offset: int) -> None:
        """Copy the bytes at ``where`` ((offset, length) from ``put``) into the open file ``fd`` at ``offset``,
        file to file (``os.copy_file_range``: no copy passes through this process's memory; a file system that
        cannot do it gets ``READ_CHUNK`` reads).

        Raises:
            OSError: when either file cannot be read or written, or the weight file ends first.
        """
        assert self.directory is not None
        start = where[0]
        src = os.open(self.directory / self.name, os.O_RDONLY)
        try:
            done, length = 0, where[1]
            while done < length:
                try:
                    got = os.copy_file_range(src, fd, min(length - done, READ_CHUNK), start + done, offset + done)
                except OSError:  # EXDEV, ENOSYS, EINVAL on some file systems: read and write instead
                    part = read_exactly(src, start + done, min(length - done, READ_CHUNK))
                    got = os.pwrite(fd, part, offset + done)
                if got <= 0:
                    raise OSError(f"the weight file ends {length - done} bytes short of a tensor's end")
                done += got
        finally:
            os.close(src)

    def mapped(self, model: onnx.ModelProto) -> Optional[onnx.ModelProto]:
        """A copy of ``model`` (not modified) whose top-level initializers of ``POINT_BYTES`` or more
        point into the file; None when the file cannot be written."""
        bare, stubbed = weightless(model, keep=lambda t: nbytes(t) < POINT_BYTES)
        for init in bare.graph.initializer:
            if init.name in stubbed and not self.point(init, stubbed[init.name]):
                return None
        return bare

    def model_path(self, model: onnx.ModelProto) -> Optional[Path]:
        """Write a mapped ``model`` beside the file for a session to load by path (ONNX Runtime finds
        external data beside the model file; the caller removes it once the session exists); None
        when it cannot be written."""
        with self._lock:
            self._sessions += 1
            path = self._open() / f"session-{self._sessions}.onnx"
        try:
            onnx.save_model(model, str(path))
        except OSError as e:
            log.warning("cannot write %s (%s): this session copies its weights", path, e.strerror)
            remove_file(path)
            return None
        return path

    def with_values(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of a mapped ``model`` holding its values again (for models written for users).

        Raises:
            ModelError: a tensor points into another process's weight file.
        """
        out = onnx.ModelProto()
        out.CopyFrom(model)
        for init in out.graph.initializer:
            if is_pointed(init):
                self._fill(init)
        return out

    def resolved(self, init: TensorProto) -> TensorProto:
        """``init`` itself, or, when it points into the file, a copy holding its values (one tensor at a
        time: ``runner.graph.streamed.save_streamed`` writes a mapped model without a whole copy of it).

        Raises:
            ModelError: it points into another process's weight file.
        """
        if not is_pointed(init):
            return init
        out = TensorProto()
        out.CopyFrom(init)
        self._fill(out)
        return out

    def _fill(self, init: TensorProto) -> None:
        """Give the pointed ``init`` its values from the file, in place."""
        if self.directory is None:
            raise ModelError(f"tensor {init.name} points into another process's weight file; please report it")
        data = self.read(self.where_of(init))
        del init.external_data[:]
        init.data_location = TensorProto.DEFAULT
        init.raw_data = data


_shared: Optional[WeightFile] = None
_shared_lock = threading.Lock()


def weight_file() -> WeightFile:
    """This process's weight file (made on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WeightFile()
        return _shared


def remove_file(path: Path) -> None:
    """Remove a session's model file (its weights stay in the weight file)."""
    path.unlink(missing_ok=True)
