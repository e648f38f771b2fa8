"""Read and write large ONNX model files piece by piece, never the whole file as one string.

``onnx.load`` reads a file into one string and parses it (the model's size twice), and
``onnx.save_model`` serializes the model into one string first (twice again). Protobuf merges
concatenated messages (a singular message field seen twice is merged, a repeated field appends,
a scalar takes the last value), so a model can be written as its graph without initializers
followed by one message per initializer, and read back by merging each top-level field, and each
field of the graph, on its own: at most one tensor is in memory twice.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable, Optional

import onnx
from google.protobuf.message import DecodeError

from runner.graph.isolate import all_graphs
from runner.graph.stubs import copy_fields, nbytes, raw_bytes, stub_of
from runner.graph.weight_file import is_pointed, weight_file

#: ModelProto's ``graph`` field (number 7, length-delimited), as its key
GRAPH_KEY = 7 << 3 | 2


def save_streamed(
    model: onnx.ModelProto, path: Path, resolve: Optional[Callable[[onnx.TensorProto], onnx.TensorProto]] = None
) -> None:
    """Write ``model`` to ``path`` as one ONNX file, one top-level initializer at a time.

    Args:
        model: the model (not modified).
        path: the file to write.
        resolve: gives the initializer to write for each of ``model``'s (``WeightFile.resolved``: a
            tensor pointed into the weight file gets its values, one at a time); None: each as it is.

    Raises:
        OSError: when the file cannot be written.
        Whatever ``resolve`` raises.
    """
    bare = onnx.ModelProto()
    copy_fields(model, bare, skip="graph")
    copy_fields(model.graph, bare.graph, skip="initializer")
    with open(path, "wb") as f:
        f.write(bare.SerializeToString())
        for init in model.graph.initializer:
            piece = onnx.ModelProto()
            piece.graph.initializer.append(resolve(init) if resolve is not None else init)
            f.write(piece.SerializeToString())


#: tensors in a data file ``save_external`` writes start on page boundaries (ONNX Runtime maps aligned ones)
DATA_ALIGN = 4096


def save_external(model: onnx.ModelProto, path: Path, location: str, threshold: int) -> None:
    """Write a model whose weights point into this process's weight file to ``path``, its initializers of
    ``threshold`` bytes or more (and every pointed one) to the data file ``location`` beside it, one tensor at a
    time: a pointed tensor is copied file to file (``WeightFile.copy_to``), so a 30 GB answer is written without
    a copy of it in memory (onnx's writer needs every tensor's bytes in the model, a second whole copy).

    Args:
        model: the model (not modified); bodies' (If, Loop, Scan) initializers of ``threshold`` bytes or more
            with raw data go to the data file too.
        path: the model file to write. location: the data file's name, beside it.
        threshold: bytes from which a tensor holding its values goes to the data file.

    Raises:
        OSError: when a file cannot be written, or the weight file read.
        ModelError: a tensor points into another process's weight file.
    """

    bare = onnx.ModelProto()
    copy_fields(model, bare, skip="graph")
    copy_fields(model.graph, bare.graph, skip="initializer")
    file = weight_file()
    fd = os.open(path.parent / location, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        size = 0

        def place(tensor: onnx.TensorProto, like: onnx.TensorProto, length: int) -> int:
            """Make ``tensor`` a stub of ``like`` pointing at the data file's next aligned ``length`` bytes; their
            offset."""
            nonlocal size
            if tensor is not like:
                tensor.CopyFrom(stub_of(like))
            offset = -(-size // DATA_ALIGN) * DATA_ALIGN
            entries = (("location", location), ("offset", str(offset)), ("length", str(length)))
            del tensor.external_data[:]
            for key, value in entries:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = onnx.TensorProto.EXTERNAL
            size = offset + length
            return offset

        for init in model.graph.initializer:
            if is_pointed(init):
                where = file.where_of(init)
                file.copy_to(where, fd, place(bare.graph.initializer.add(), init, where[1]))
            elif init.data_location != onnx.TensorProto.EXTERNAL and nbytes(init) >= threshold:
                data = raw_bytes(init)
                os.pwrite(fd, data, place(bare.graph.initializer.add(), init, len(data)))
            else:
                bare.graph.initializer.append(init)
        for graph in all_graphs(bare.graph):
            if graph is bare.graph:
                continue  # its initializers are placed above
            for tensor in graph.initializer:
                if tensor.HasField("raw_data") and len(tensor.raw_data) >= threshold:
                    data = tensor.raw_data
                    tensor.ClearField("raw_data")
                    os.pwrite(fd, data, place(tensor, tensor, len(data)))
    finally:
        os.close(fd)
    with open(path, "wb") as f:
        f.write(bare.SerializeToString())


def load_streamed(path: Path) -> onnx.ModelProto:
    """Parse the model file ``path`` field by field (external data is not loaded).

    Raises:
        DecodeError: when the file is not a well-formed protobuf message.
        OSError: when it cannot be read.
    """
    model = onnx.ModelProto()
    with open(path, "rb") as f:
        while (key := _varint(f)) is not None:
            if key != GRAPH_KEY:
                model.MergeFromString(_field(f, key))
                continue
            end = _required(f) + f.tell()
            while f.tell() < end:
                model.graph.MergeFromString(_field(f, _required(f)))
            if f.tell() != end:
                raise DecodeError("a graph field runs past its length")
    return model


def _varint(f: BinaryIO) -> Optional[int]:
    """The next varint, or None at the end of the file."""
    result = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            if shift:
                raise DecodeError("the file ends inside a varint")
            return None
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise DecodeError("a varint longer than 10 bytes")


def _required(f: BinaryIO) -> int:
    value = _varint(f)
    if value is None:
        raise DecodeError("the file ends inside a field")
    return value


def _encoded(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise DecodeError("the file ends inside a field")
    return data


def _field(f: BinaryIO, key: int) -> bytes:
    """The whole encoding (key included) of the field whose key was just read."""
    wire = key & 7
    head = _encoded(key)
    if wire == 0:
        return head + _encoded(_required(f))
    if wire == 1:
        return head + _read(f, 8)
    if wire == 5:
        return head + _read(f, 4)
    if wire == 2:
        length = _required(f)
        return head + _encoded(length) + _read(f, length)
    raise DecodeError(f"wire type {wire} is not used by ONNX")
