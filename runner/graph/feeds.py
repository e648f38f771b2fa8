"""Model inputs for in-process runs: generated from a seed and the input shapes, or loaded from .npz."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper

from runner.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

Spec = Tuple[str, np.dtype, List[int]]


def graph_inputs(model: onnx.ModelProto) -> List[onnx.ValueInfoProto]:
    """The graph's real inputs (initializers listed as inputs, as in IR < 4 models, are left out)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def check_input_shapes(
    model: onnx.ModelProto, input_shapes: Optional[Mapping[str, Sequence[int]]]
) -> Dict[str, List[int]]:
    """Validate ``model_input_shapes`` against the model's inputs.

    Returns:
        ``{input name: [dims]}`` as plain ints.

    Raises:
        ConfigError: when it is not a mapping of lists of non-negative ints, names an unknown
            input, or gives the wrong rank.
    """
    if not input_shapes:
        return {}
    if not isinstance(input_shapes, Mapping):
        raise ConfigError(
            f"model_input_shapes={input_shapes!r} is not a mapping; write it as model_input_shapes={{x:[1,3,224,224]}}"
        )
    by_name = {i.name: i for i in graph_inputs(model)}
    shapes: Dict[str, List[int]] = {}
    for name, dims in input_shapes.items():
        if name not in by_name:
            raise ConfigError(
                f"model_input_shapes names {name!r}, which is not a model input; inputs are {sorted(by_name)}"
            )
        try:
            shapes[name] = [int(d) for d in dims]
        except (TypeError, ValueError):
            raise ConfigError(
                f"model_input_shapes.{name}={dims!r} is not a list of integers; write e.g. {name}:[1,3,224,224]"
            ) from None
        if any(d < 0 for d in shapes[name]):
            raise ConfigError(f"model_input_shapes.{name}={shapes[name]} has a negative dimension; give concrete sizes")
        tt = by_name[name].type.tensor_type
        if tt.HasField("shape") and len(tt.shape.dim) != len(shapes[name]):
            raise ConfigError(
                f"model_input_shapes gives {name} rank {len(shapes[name])} but the model says rank "
                f"{len(tt.shape.dim)}; give {len(tt.shape.dim)} dims"
            )
    return shapes


def recorded_shapes(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray], source: str) -> Dict[str, List[int]]:
    """The shapes of the recorded arrays of the model's inputs, checked against the declared dims.

    Args:
        model: the model.
        arrays: recorded values by tensor name (``inputs=`` or ``golden=``); other tensors are ignored.
        source: the option and file, for error messages.

    Returns:
        ``{input name: [dims]}`` for each graph input found in ``arrays``.

    Raises:
        ConfigError: an array whose rank or fixed dimensions differ from the model's input.
    """
    shapes: Dict[str, List[int]] = {}
    for vi in graph_inputs(model):
        if vi.name not in arrays:
            continue
        shape = [int(d) for d in np.asarray(arrays[vi.name]).shape]
        declared = vi.type.tensor_type.shape.dim
        fixed = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in declared]
        if len(declared) and (len(fixed) != len(shape) or any(f is not None and f != s for f, s in zip(fixed, shape))):
            raise ConfigError(
                f"{source}: {vi.name} has shape {shape} but the model's input is {[f or '?' for f in fixed]}; "
                "record it from this model (save_golden=) or give the right file"
            )
        shapes[vi.name] = shape
    return shapes


def input_specs(model: onnx.ModelProto, input_shapes: Optional[Mapping[str, Sequence[int]]] = None) -> List[Spec]:
    """Name, numpy dtype and concrete shape of each graph input.

    Dynamic dimensions take their value from ``input_shapes`` (``model_input_shapes=``); a
    dynamic dimension with no value there becomes 1, with a warning naming the option.

    Args:
        model: the model.
        input_shapes: ``{input name: [dims]}``.

    Returns:
        One ``(name, dtype, shape)`` per input, in graph order.

    Raises:
        ConfigError: when ``input_shapes`` names an unknown input or has the wrong rank.
        ModelError: when an input is not a tensor.
    """
    input_shapes = check_input_shapes(model, input_shapes)
    specs = []
    for vi in graph_inputs(model):
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"model input {vi.name!r} is not a tensor; only tensor inputs are supported")
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        declared = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim]
        if vi.name in input_shapes:
            dims = list(input_shapes[vi.name])
        else:
            if any(d is None for d in declared):
                log.warning(
                    "Input %s has dynamic dims %s; using 1 for them (set model_input_shapes={%s:[...]})",
                    vi.name,
                    declared,
                    vi.name,
                )
            dims = [1 if d is None else d for d in declared]
        specs.append((vi.name, dtype, dims))
    return specs


def generate_feeds(
    specs: Sequence[Spec], seed: int = 0, ranges: Optional[Mapping[str, Tuple[float, float]]] = None
) -> Dict[str, np.ndarray]:
    """Random inputs from ``seed``, as Polygraphy's default data loader makes them.

    Args:
        specs: ``(name, dtype, shape)`` per input (``input_specs``).
        seed: the random seed.
        ranges: ``{input name: (low, high)}`` (``val_range=``); floats are uniform in [low, high),
            integers uniform in [low, high] (both ends included); inputs not named use [0, 1].
            Booleans are uniform either way.

    Returns:
        ``{name: array}`` of the spec's dtype and shape.
    """
    rng = np.random.default_rng(seed)
    ranges = ranges or {}
    feeds: Dict[str, np.ndarray] = {}
    for name, dtype, shape in specs:
        lo, hi = ranges.get(name, (0.0, 1.0))
        if np.issubdtype(dtype, np.floating):
            feeds[name] = (lo + (hi - lo) * rng.random(shape, dtype=np.float64)).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[name] = rng.integers(int(np.ceil(lo)), int(np.floor(hi)) + 1, shape).astype(dtype)
    return feeds


def load_npz(path: str | Path, option: str) -> Dict[str, np.ndarray]:
    """Load every array of an .npz file.

    Raises:
        ConfigError: when the file is missing or a directory, not an .npz archive (a .npy array, a truncated or
            damaged archive, pickled objects).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option}={path} is a directory; give an .npz file (numpy.savez)")
    if not path.is_file():
        raise ConfigError(f"{option}={path}: no such file; give an .npz file (numpy.savez)")
    hint = "write it with numpy.savez(path, name=array, ...)"
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as e:  # numpy raises OSError, ValueError, zipfile.BadZipFile, EOFError, ...
        raise ConfigError(f"{option}={path}: not a readable .npz file ({type(e).__name__}: {e}); {hint}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ConfigError(f"{option}={path} holds one unnamed array (.npy), not named arrays (.npz); {hint}")
    try:
        with data:
            return {k: data[k] for k in data.files}
    except Exception as e:  # a damaged member shows only when read
        raise ConfigError(f"{option}={path}: a damaged .npz file ({type(e).__name__}: {e}); {hint}") from None


def as_declared(value: np.ndarray, elem_type: Optional[int]) -> np.ndarray:
    """``value`` in the numpy type of an input's declared ONNX type (e.g. fp32 golden values fed to
    an fp16 model); non-numeric types and types numpy lacks (bfloat16) are left for the backend."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)) if elem_type else None
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf" or value.dtype == dtype:
        return value
    return value.astype(dtype)


def model_sample(model: onnx.ModelProto, sample: Mapping[str, np.ndarray], source: str) -> Dict[str, np.ndarray]:
    """The model's inputs taken from a loaded sample (other arrays in it are left out), each in
    its input's declared type.

    Raises:
        ConfigError: when the sample lacks one of the model's inputs, or holds text or objects for a numeric one.
    """
    missing = [i.name for i in graph_inputs(model) if i.name not in sample]
    if missing:
        raise ConfigError(f"{source} lacks model inputs {missing}; save every input of the model")
    out = {}
    for i in graph_inputs(model):
        value, declared = np.asarray(sample[i.name]), i.type.tensor_type.elem_type
        if value.dtype.kind not in "biufc" and declared != onnx.TensorProto.STRING:
            shown = str(value.ravel()[:1].tolist())[:40]
            raise ConfigError(
                f"{source}: input {i.name} holds {value.dtype.name} values such as {shown}, and the model takes "
                f"{helper.tensor_dtype_to_string(declared) if declared else 'numbers'}; give numeric arrays"
            )
        out[i.name] = as_declared(value, declared)
    return out


def model_feeds(
    model: onnx.ModelProto,
    input_shapes: Optional[Mapping[str, Sequence[int]]],
    inputs: Optional[str],
    seed: int,
    ranges: Optional[Mapping[str, Tuple[float, float]]] = None,
) -> Dict[str, np.ndarray]:
    """One sample of inputs for ``model``: loaded from the ``.npz`` file ``inputs`` when given (all
    inputs must be there), else generated from ``seed`` within ``ranges``.

    Raises:
        ConfigError: when the loaded file is unreadable or lacks one of the model's inputs.
    """
    if inputs:
        return model_sample(model, load_npz(inputs, "inputs"), f"inputs={inputs}")
    return generate_feeds(input_specs(model, input_shapes), seed, ranges)
