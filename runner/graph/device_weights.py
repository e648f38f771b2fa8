"""Weights kept in a GPU's memory across ONNX Runtime sessions, so that a candidate's session does not read
and copy again what it shares with the candidates before it.

A precision search builds one session per candidate, and each candidate of a large model holds almost all of
its weights in the forms the one before held (the original fp32 tensors, their fp16 forms, a kept node's fp32
copy). A session of a mapped model (``runner.graph.weight_file``) on the CUDA provider reads every weight from the
weight file and copies it to the GPU. Here each distinct weight is copied to the device once, as an
``onnxruntime.OrtValue``, and every later session takes it through ``SessionOptions.add_initializer`` (a DLPack
view of it: ONNX Runtime takes only buffers it does not own), which ONNX Runtime uses in place when the weight
is planned on that device (its ``initializers_to_share_map``); a weight planned elsewhere (a CPU node's) is read
from the model as before. The values are the same bytes, so a candidate computes what it computes without this
(``benchmarks/check_phases.py`` checks it bit for bit). On an H200 a 0.5B decoder's candidate session took
0.75 s so, against 1.05 s reading its weights (``benchmarks/README.md``, "Where a check of the 0.5B goes").

A weight is known by where the weight file holds it (offset and length: the file writes each distinct
content once), its element type and its shape. Weights are kept until the process ends, up to the card's
memory less room for the sessions (``card_limit``); past it, later weights are read as before. Only the CUDA
provider's sessions take them (``device_of``), and only weights numpy can hold (float32, float16, the integers).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto

from runner.errors import ModelError
from runner.graph.weight_file import is_pointed, weight_file

log = logging.getLogger(__name__)

#: the most bytes of weights one process keeps on one device whose memory is not known (no ``nvidia-smi``); later
#: ones are read from the weight file by each session. A 0.5B decoder's weights and their fp16 forms are 3.6 GB
LIMIT_BYTES = 16 * 2**30

#: the share of a card's memory left to sessions (activations, workspaces) beside the kept weights, at least
#: ``ROOM_MIN_BYTES``: an H100's 80 GB keeps 60 GB of weights, a 7B decoder's fp32 and fp16 forms (46 GB) with them
ROOM_SHARE, ROOM_MIN_BYTES = 0.25, 8 * 2**30


def card_limit(device_id: int) -> int:
    """The bytes of weights kept on CUDA card ``device_id``: its memory less the room sessions need (``ROOM_SHARE``),
    as ``nvidia-smi`` reports it; ``LIMIT_BYTES`` where it cannot be asked. Each worker of ``executor=processes``
    on a card keeps its own weights: one worker per card (``executor.gpus=``)."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={int(device_id)}", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        total = int(float(out.split()[0]) * 2**20)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return LIMIT_BYTES
    return int(total - max(total * ROOM_SHARE, ROOM_MIN_BYTES))


#: element types a weight kept on the device may have (those numpy holds as they are)
KEPT_TYPES: Dict[int, Any] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
    TensorProto.INT8: np.int8,
    TensorProto.UINT8: np.uint8,
    TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64,
}

#: a kept weight's key: offset and length in bytes in the weight file, element type, shape
Key = Tuple[int, int, int, Tuple[int, ...]]


class DeviceWeights:
    """The weights kept on one device, each copied there once (module docstring).

    Args:
        device: ONNX Runtime's device name for ``OrtValue.ortvalue_from_numpy`` ("cuda"; "cpu" runs the same
            path on the CPU provider, as the tests do).
        device_id: the device's number, as the provider's ``device_id`` option counts them.
        limit: the most bytes kept (``LIMIT_BYTES``).

    Attributes:
        kept_bytes: bytes of weights on the device now.
        shared: how many weights sessions took from the device so far (a weight counts once per session).
    """

    def __init__(self, device: str, device_id: int, limit: int = LIMIT_BYTES):
        self.device, self.device_id, self.limit = device, int(device_id), int(limit)
        self._values: Dict[Key, Any] = {}
        self._owners: List[Tuple[Optional[np.ndarray], Any]] = []  # what each view's memory belongs to
        self._lock = threading.Lock()
        self.kept_bytes = 0
        self.shared = 0
        self._full = False

    def share(self, model: onnx.ModelProto, options: Any) -> None:
        """Give the session ``options`` will make every weight of ``model`` pointed into this process's weight
        file from the device, copying there first those not kept yet.

        Args:
            model: a mapped model (``runner.graph.weight_file.WeightFile.mapped``); not modified.
            options: the session's ``onnxruntime.SessionOptions`` (``add_initializer`` is called on it).

        Raises:
            OSError: the weight file cannot be read.
        """
        for init in model.graph.initializer:
            key = _key(init)
            if key is None:
                continue
            value = self._value(key)
            if value is None:
                continue
            options.add_initializer(init.name, value)
            with self._lock:
                self.shared += 1

    def _value(self, key: Key) -> Any:
        """The kept weight of ``key``, copied to the device now if it is new and fits under ``limit``."""
        import onnxruntime as ort

        with self._lock:
            if key in self._values:
                return self._values[key]
            if self.kept_bytes + key[1] > self.limit:
                if not self._full:
                    self._full = True
                    log.info(
                        "%.1f GB of weights are kept on %s:%d (the limit); sessions read the rest from the weight file",
                        self.kept_bytes / 1e9,
                        self.device,
                        self.device_id,
                    )
                return None
            offset, length, elem, dims = key
            data = np.frombuffer(weight_file().read((offset, length)), dtype=KEPT_TYPES[elem]).reshape(dims)
            owner = ort.OrtValue.ortvalue_from_numpy(data, self.device, self.device_id)
            # a session takes only a buffer it does not own: a DLPack view of the copy, which stays here
            view = ort.OrtValue(ort.capi._pybind_state.OrtValue.from_dlpack(owner._ortvalue.to_dlpack()))
            self._values[key] = view
            # a CPU OrtValue wraps the array's memory; a device one holds a copy, and the host array goes (a 7B
            # decoder's run held its 46 GB of weights on the host twice when each array was kept)
            self._owners.append((data if self.device == "cpu" else None, owner))
            self.kept_bytes += length
            return view


def _key(init: TensorProto) -> Optional[Key]:
    """The key of a weight ``init`` points at in the weight file, or None: it holds its values, or its type is
    not one numpy holds."""
    if not is_pointed(init) or init.data_type not in KEPT_TYPES:
        return None
    try:
        offset, length = weight_file().where_of(init)
    except ModelError:  # another process's file: the session reads it (and says why it cannot)
        return None
    return offset, length, int(init.data_type), tuple(int(d) for d in init.dims)


_devices: Dict[Tuple[str, int], DeviceWeights] = {}
_devices_lock = threading.Lock()


def device_weights(device: str, device_id: int) -> DeviceWeights:
    """This process's weights kept on ``device`` number ``device_id`` (made on first use)."""
    with _devices_lock:
        key = (device, int(device_id))
        if key not in _devices:
            limit = card_limit(device_id) if device == "cuda" else LIMIT_BYTES
            _devices[key] = DeviceWeights(device, device_id, limit)
        return _devices[key]


def device_of(providers: Sequence[Any]) -> Optional[Tuple[str, int]]:
    """The device whose kept weights a session on ``providers`` takes: ("cuda", its ``device_id``, 0 when not
    given) when the first provider is CUDA's, else None.

    Args:
        providers: names, or ``(name, options)`` pairs, as ``runner.graph.sessions.session_for`` takes them.
    """
    if not providers:
        return None
    first = providers[0]
    name, options = (first, {}) if isinstance(first, str) else (first[0], dict(first[1]))
    if name != "CUDAExecutionProvider":
        return None
    return "cuda", int(options.get("device_id", 0))
