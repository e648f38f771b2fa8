"""Where a run's input samples and golden values come from.

A sample is one feed dict ``{input name: array}``. Sources, as Polygraphy's data loader options:

- ``inputs=FILE.npz``: one sample (``numpy.savez``).
- ``inputs=FILE.json``: the samples ``polygraphy run --save-inputs`` wrote (a list of feed dicts),
  read with Polygraphy's own JSON reader (the ``polygraphy`` extra).
- ``data_loader=pkg.module.fn``: a function returning an iterable of feed dicts (Polygraphy's
  ``--data-loader-script``).
- neither: one sample generated from ``seed``, floats uniform in ``val_range`` (Polygraphy's
  ``--val-range``; default [0, 1]).

Golden values (``golden=``) are an ``.npz`` file of one sample's tensors, or the JSON that
``polygraphy run --save-outputs`` wrote (one runner's outputs per iteration).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import onnx

from runner.errors import ArtifactError, ConfigError, MissingExtraError, first_line
from runner.files.inputs import script_target
from runner.graph.feeds import graph_inputs, load_npz
from runner.targets import locate
from runner.terminal.signals import Interrupted
from runner.write_guard import check_write

log = logging.getLogger(__name__)

Sample = Dict[str, np.ndarray]
#: the most samples a data loader is read for when ``data_loader_max_samples=`` is not given
DEFAULT_MAX_SAMPLES = 1000
#: the most megabytes of input arrays a data loader brings when ``data_loader_max_mb=`` is not given: every check
#: runs every sample, and a run holds each sample's inputs and compared outputs for its whole length
DEFAULT_MAX_MB = 64.0
Range = Tuple[float, float]


def _polygraphy(option: str, path: Path) -> Any:
    """Polygraphy's JSON module, or a one-line error naming the extra."""
    try:
        from polygraphy import json as pjson
    except ImportError:
        raise MissingExtraError(
            "polygraphy", "polygraphy", f"{option}={path} (Polygraphy JSON, read with Polygraphy's own reader)"
        ) from None
    return pjson


def _arrays(obj: Any, where: str) -> Sample:
    """A decoded feed dict as ``{name: ndarray}``, or a one-line error (values of the wrong kind for the model's
    inputs are ``runner.graph.feeds.model_sample``'s)."""
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
        raise ConfigError(f"{where} is not a mapping of tensor names to arrays; write feed dicts")
    arrays = {}
    for name, value in obj.items():
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as e:  # ragged lists
            raise ConfigError(f"{where}: {name} is no array ({first_line(e)}); give a numpy array") from None
        arrays[name] = array
    return arrays


def _polygraphy_error(option: str, path: Path, e: Exception) -> ConfigError:
    first = first_line(e)
    return ConfigError(f"{option}={path}: Polygraphy cannot read it ({first}); give the file polygraphy wrote")


def _polygraphy_file(option: str, path: Path, writer: str) -> Any:
    """Polygraphy's JSON module for an existing JSON file named by ``option``.

    Raises:
        ConfigError: no such file (``writer`` names the polygraphy option that writes one).
        MissingExtraError: polygraphy is not installed.
    """
    if not path.exists():
        raise ConfigError(f"{option}={path}: no such file; give polygraphy run {writer} output or an .npz file")
    return _polygraphy(option, path)


def load_input_samples(path: str | Path) -> List[Sample]:
    """The samples in an ``inputs=`` file: an ``.npz`` (one sample) or Polygraphy JSON (a list).

    Raises:
        ConfigError: a missing, unreadable or empty file, or one that does not hold feed dicts.
        MissingExtraError: a JSON file without polygraphy installed.
    """
    path = Path(path)
    if path.suffix.lower() != ".json":
        return [load_npz(path, "inputs")]
    pjson = _polygraphy_file("inputs", path, "--save-inputs")
    try:
        obj = pjson.load_json(str(path), description="input data")
    except Exception as e:  # Polygraphy raises PolygraphyException, JSONDecodeError, OSError, ...
        raise _polygraphy_error("inputs", path, e) from None
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise ConfigError(f"inputs={path} holds no samples; save at least one with polygraphy run --save-inputs")
    return [_arrays(item, f"inputs={path} sample {i}") for i, item in enumerate(items)]


def load_golden_samples(path: str | Path) -> List[Sample]:
    """The golden values in a ``golden=`` file: an ``.npz`` (one sample) or the JSON that
    ``polygraphy run --save-outputs`` wrote (``RunResults``: the first runner's iterations; other
    runners in the file are named in the log and left out).

    Raises:
        ConfigError: a missing, unreadable or empty file.
        MissingExtraError: a JSON file without polygraphy installed.
    """
    path = Path(path)
    if path.suffix.lower() != ".json":
        return [load_npz(path, "golden")]
    _polygraphy_file("golden", path, "--save-outputs")
    from polygraphy.comparator import RunResults

    try:
        results = RunResults.load(str(path))
    except Exception as e:  # Polygraphy raises PolygraphyException, JSONDecodeError, OSError, ...
        raise _polygraphy_error("golden", path, e) from None
    runs = list(results.items())
    if not runs or not runs[0][1]:
        raise ConfigError(f"golden={path} holds no results; save them with polygraphy run --save-outputs")
    name, iterations = runs[0]
    if len(runs) > 1:
        log.info("golden=%s: using runner %s; left out %s", path, name, [r for r, _ in runs[1:]])
    return [_arrays(dict(it), f"golden={path} iteration {i}") for i, it in enumerate(iterations)]


def _raised_by_code(e: BaseException) -> bool:
    """Whether ``e`` is the user's code ending the process: ``sys.exit``, or a ``KeyboardInterrupt`` it raised
    itself (a real Ctrl-C, SIGTERM or SIGHUP arrives as ``runner.terminal.signals.Interrupted`` and is left
    to end the run)."""
    return isinstance(e, SystemExit) or (isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted))


def _ended(target: str, where: str, e: BaseException) -> ConfigError:
    """The one line for a loader that ends the process (``sys.exit``, ``raise KeyboardInterrupt``) in ``where``."""
    how = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else "raised KeyboardInterrupt"
    return ConfigError(
        f"data_loader={target}: {where} {how}; a data loader returns or yields feed dicts, it does not end the process"
    )


def _script_function(target: str, script: Path, fn_name: str) -> Any:
    """The function ``fn_name`` of the Python file ``script`` (Polygraphy's ``--data-loader-script``).

    Raises:
        ConfigError: no such file, a file that raises (or exits) on import, or no such function in it.
    """
    if not script.is_file():
        raise ConfigError(f"data_loader={target}: no such file {script}; give path/to/loader.py[:function]")
    spec = importlib.util.spec_from_file_location(f"_data_loader_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code
        raise ConfigError(f"data_loader={target}: {script} raised {type(e).__name__} on import: {e}") from None
    except BaseException as e:
        if _raised_by_code(e):
            raise _ended(target, f"{script} on import", e) from None
        raise
    if not hasattr(module, fn_name):
        raise ConfigError(f"data_loader={target}: {script} has no {fn_name} (name it: {script}:function)")
    return getattr(module, fn_name)


def loader_samples(target: str, cap: int = DEFAULT_MAX_SAMPLES, cap_mb: float = DEFAULT_MAX_MB) -> List[Sample]:
    """Call the data loader and read the feed dicts its iterable yields, lazily and at most ``cap`` of them and
    ``cap_mb`` megabytes of arrays: ``data_loader=pkg.module.fn``, or a script as Polygraphy's
    ``--data-loader-script`` takes it (``loader.py:fn``; ``loader.py`` for its ``load_data``). A loader that yields
    more (one that never ends) is read no further, with one warning naming the bound it met and its key
    (``data_loader_max_samples=``, ``data_loader_max_mb=``); a loader that takes a while says how far it got every
    ``PROGRESS_S`` seconds. The first sample is always read, whatever its size.

    Args:
        target: ``data_loader=`` as given.
        cap: the most samples read (``data_loader_max_samples=``), 1 or more.
        cap_mb: the most megabytes (2**20 bytes) of arrays read (``data_loader_max_mb=``), above 0.

    Returns:
        The samples read, in the loader's order.

    Raises:
        ConfigError: a name that is neither form, a module, script or function that cannot be
            found, a function that raises (or calls ``sys.exit``), returns something not iterable,
            yields something that is not a feed dict, or yields nothing; a cap below 1.
    """
    if not isinstance(cap, int) or cap < 1:
        raise ConfigError(f"data_loader_max_samples={cap}: give how many samples a data loader may yield, 1 or more")
    if not isinstance(cap_mb, (int, float)) or not math.isfinite(cap_mb) or cap_mb <= 0:
        raise ConfigError(f"data_loader_max_mb={cap_mb}: give how many megabytes of samples a data loader may bring")
    script = script_target(target)
    if script is not None:
        fn = _script_function(target, *script)
    else:
        fn = _module_function(target)
    if not callable(fn):
        raise ConfigError(f"data_loader={target} is not a function; name a function returning feed dicts")
    return _collect(target, fn, cap, int(cap_mb * 2**20))


def _module_function(target: str) -> Any:
    """The function of ``pkg.module.fn``.

    Raises:
        ConfigError: not of that form, a module or function that cannot be found, or a module that exits on
            import.
    """
    module_name, _, fn_name = target.rpartition(".")
    if not module_name or not fn_name:  # neither form: name both (locate's error names only module.function)
        raise ConfigError(
            f"data_loader={target!r} is neither module.function nor loader.py[:function]; write e.g. "
            "data_loader=my_data.load or data_loader=loader.py:load_data"
        )
    try:
        return locate(target, "data_loader", ConfigError)
    except BaseException as e:
        if _raised_by_code(e):
            raise _ended(target, f"importing {module_name}", e) from None
        raise


#: seconds between the progress lines of a loader being read
PROGRESS_S = 2.0


def _collect(target: str, fn: Any, cap: int, cap_bytes: int) -> List[Sample]:
    """At most ``cap`` feed dicts ``fn()`` yields, and at most ``cap_bytes`` of arrays but the first (one more is
    asked for, to tell a loader past the cap).

    Raises:
        ConfigError: it raises or exits, yields something that is not a feed dict, or yields nothing.
    """
    samples: List[Sample] = []
    start = last = time.monotonic()
    size = 0
    past: Optional[str] = None
    try:
        for i, item in enumerate(fn()):
            if i == cap:
                past = f"more than {cap} samples (data_loader_max_samples=N reads up to N)"
                break
            sample = _arrays(item, f"data_loader={target} item {i}")
            nbytes = sum(a.nbytes for a in sample.values())
            if samples and size + nbytes > cap_bytes:
                past = (
                    f"more than {cap_bytes / 2**20:g} MB of samples ({nbytes / 2**20:.2f} MB each; "
                    "data_loader_max_mb=N reads up to N MB)"
                )
                break
            samples.append(sample)
            size += nbytes
            if time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                log.info(
                    "data_loader=%s: %d samples read (%.1f MB) in %.0f s, of at most %d",
                    target, len(samples), size / 2**20, last - start, cap,
                )  # fmt: skip
    except ConfigError:
        raise
    except Exception as e:  # the user's code
        raise ConfigError(f"data_loader={target} raised {type(e).__name__}: {e}") from None
    except BaseException as e:
        if _raised_by_code(e):
            raise _ended(target, "its function", e) from None
        raise
    if not samples:
        raise ConfigError(f"data_loader={target} yielded no feed dicts; yield at least one")
    if past is not None:
        log.warning("data_loader=%s yields %s; the run uses the first %d", target, past, len(samples))
    return samples


def parse_val_range(value: Any, names: List[str]) -> Dict[str, Range]:
    """``val_range=`` as a range per input.

    Args:
        value: None, ``[lo, hi]`` (every input) or ``{input: [lo, hi], default: [lo, hi]}``.
        names: the model's input names.

    Returns:
        ``{input name: (lo, hi)}`` for the inputs it covers (others keep the default [0, 1]).

    Raises:
        ConfigError: a range that is not two numbers with lo <= hi, or an unknown input name.
    """
    if value is None:
        return {}

    def one(v: Any, key: str) -> Range:
        try:
            lo, hi = (float(x) for x in v)
        except (TypeError, ValueError):
            raise ConfigError(f"val_range{key}={v!r} is not [low, high]; write e.g. val_range={{x:[0,255]}}") from None
        if not (math.isfinite(lo) and math.isfinite(hi)):  # uniform over [0, inf] draws inf and nothing else
            raise ConfigError(
                f"val_range{key}=[{lo}, {hi}]: give finite bounds (inputs are drawn uniformly between them)"
            )
        if not lo <= hi:
            raise ConfigError(f"val_range{key}=[{lo}, {hi}] has low > high")
        return lo, hi

    if not isinstance(value, Mapping):
        rng = one(value, "")
        return {n: rng for n in names}
    unknown = [k for k in value if k != "default" and k not in names]
    if unknown:
        raise ConfigError(f"val_range names {unknown}, which are not model inputs; inputs are {names}")
    out = {n: one(value["default"], ".default") for n in names} if "default" in value else {}
    out.update({str(k): one(v, f".{k}") for k, v in value.items() if k != "default"})
    return out


def check_sources(inputs: Optional[str], data_loader: Optional[str], val_range: Any) -> None:
    """One source of input samples at a time.

    Raises:
        ConfigError: ``inputs=`` with ``data_loader=``, or ``val_range=`` with either (it shapes
            generated inputs only).
    """
    if inputs and data_loader:
        raise ConfigError("inputs= and data_loader= both give the inputs; keep one")
    if val_range is not None and (inputs or data_loader):
        raise ConfigError("val_range= shapes generated inputs only; drop it, or drop inputs=/data_loader=")


def check_golden(
    model: onnx.ModelProto, golden: List[Sample], samples: List[Sample], path: Optional[str], given: bool
) -> None:
    """Loaded golden values fit the run: one per input sample, made from those inputs, holding
    every output of the model.

    Args:
        model: the model.
        golden: the golden values per sample (``golden=``).
        samples: the input samples of the run.
        path: the ``golden=`` file, for messages.
        given: whether the inputs came from ``inputs=`` or ``data_loader=`` (else from the golden
            file itself, which must then hold them).

    Raises:
        ConfigError: naming the mismatch and the fix.
    """
    names = [i.name for i in graph_inputs(model)]
    if not given and not all(n in g for g in golden for n in names):
        raise ConfigError(
            f"golden={path} holds no values for the model inputs {names}; give the inputs it was made "
            "from: inputs=FILE (polygraphy run --save-inputs, or an .npz)"
        )
    if len(golden) != len(samples):
        raise ConfigError(
            f"golden={path} holds {len(golden)} samples but the inputs {len(samples)}; give the inputs "
            "the golden values were made from"
        )
    for i, values in enumerate(golden):
        missing = [o.name for o in model.graph.output if o.name not in values]
        if missing:
            raise ConfigError(
                f"golden={path} sample {i} lacks outputs {missing}; write it with save_golden=PATH from the "
                "original model"
            )


def save_input_samples(path: str | Path, samples: List[Sample]) -> None:
    """Write input samples as Polygraphy's ``--save-inputs`` JSON (a list of feed dicts), which
    ``polygraphy run --load-inputs`` and ``inputs=`` read.

    Raises:
        ArtifactError: the file cannot be written.
        MissingExtraError: polygraphy is not installed.
    """
    pjson = _polygraphy("inputs", Path(path))
    try:
        pjson.save_json([dict(s) for s in samples], str(path))
    except OSError as e:
        raise ArtifactError(f"cannot write {path} ({e.strerror}); choose a writable location") from None


def save_golden_samples(path: str | Path, samples: List[Sample]) -> None:
    """Write golden values for ``golden=`` to read back: an ``.npz`` of one sample, or for a path
    ending in ``.json`` Polygraphy's ``RunResults`` (every sample, one runner named ``golden``),
    which ``polygraphy run --load-outputs`` also reads.

    Raises:
        ConfigError: several samples for an ``.npz`` path.
        ArtifactError: the file cannot be written.
        MissingExtraError: a ``.json`` path without polygraphy installed.
    """
    path = Path(path)
    check_write(path, "save_golden=")
    try:
        if path.suffix.lower() == ".json":
            _polygraphy("save_golden", path)
            from polygraphy.comparator import RunResults
            from polygraphy.comparator.struct import IterationResult

            results = RunResults()
            results.append(("golden", [IterationResult(outputs=dict(s), runner_name="golden") for s in samples]))
            results.save(str(path))
            return
        if len(samples) > 1:
            raise ConfigError(
                f"save_golden={path}: an .npz holds one sample and this run has {len(samples)}; "
                "name a .json file to save them all in Polygraphy's format"
            )
        savez: Any = np.savez  # numpy's stub types **arrays as its keyword options
        savez(path, **samples[0])
    except OSError as e:
        raise ArtifactError(f"save_golden={path}: cannot write ({e.strerror}); choose a writable path") from None
