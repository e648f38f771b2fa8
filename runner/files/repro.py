"""The repro bundle of a reduced model: the values that make it fail, for someone without the original.

A reduced subgraph's inputs are internal tensors of the original model, so ``reduced.onnx`` alone
cannot be run on the values that fail (feeding it the original inputs by position fills the wrong
tensors). Beside it, reduce writes ``reduced_inputs.json`` (the values of its inputs, computed from
the original model on the run's samples) and, with ``checker=compare``, ``reduced_golden.json`` (the
golden values of its outputs that the check compared against), in Polygraphy's JSON, so that
``polygraphy run reduced.onnx --onnxrt --load-inputs reduced_inputs.json --load-outputs
reduced_golden.json`` reproduces the failure.

A failure the check saw only in a low precision (``checker.backend=fp16_emulation``,
``checker.low_precision=float16``) is not in the fp32 subgraph: the bundle then holds the subgraph
as the check ran it too (``reduced_float16_emulated.onnx``: the float16 conversion with each fp16
tensor rounded through Casts, which any fp32 runtime reproduces; ``reduced_float16.onnx`` for a
backend with fp16 kernels), and ``repro_command`` names the model that reproduces it.
"""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.errors import InvalidCandidateError, MissingExtraError, ModelError
from runner.files.samples import save_golden_samples, save_input_samples
from runner.graph.activations import run_tensors
from runner.graph.load import save_model

log = logging.getLogger(__name__)

Sample = Dict[str, np.ndarray]


def bundle_paths(output: Path) -> Dict[str, Path]:
    """Where the bundle of ``output`` goes: ``<stem>_inputs.json`` and ``<stem>_golden.json`` beside it."""
    return {
        "repro_inputs": output.with_name(f"{output.stem}_inputs.json"),
        "repro_golden": output.with_name(f"{output.stem}_golden.json"),
    }


def values_of(
    model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
) -> List[Sample]:
    """The values of the tensors ``names`` (graph inputs or node outputs of ``model``) for each sample,
    from one ONNX Runtime run per sample.

    Raises:
        ModelError: ONNX Runtime cannot run the model.
    """
    inputs = {i.name for i in model.graph.input}
    computed = [n for n in names if n not in inputs]
    out = []
    for feeds in samples:
        got = run_tensors(model, feeds, computed) if computed else {}
        out.append({n: np.asarray(feeds[n] if n in inputs else got[n]) for n in names})
    return out


def write_bundle(
    output: Path,
    reduced: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    original: Optional[onnx.ModelProto] = None,
    as_run: Optional[Callable[[onnx.ModelProto], Optional[Tuple[onnx.ModelProto, str]]]] = None,
    tolerance: Optional[Sequence[str]] = None,
) -> Dict[str, str]:
    """Write the repro bundle of the reduced model written at ``output``.

    Args:
        output: the reduced model's path.
        reduced: the reduced model (its graph inputs and outputs name the tensors).
        samples: per sample, values by tensor name: the compare checker's (inputs and golden values
            of every tensor), or the run's input feeds, whose other tensors are then computed from
            ``original``.
        original: the original model, to compute tensors ``samples`` lack; None: take them as given.
        as_run: how the check ran the reduced model when not as written (``CompareChecker.as_run``).
        tolerance: the run's tolerance as ``polygraphy run`` options (``Tolerances.polygraphy_args``), for
            ``repro_command`` to judge as the run judged; None: Polygraphy's default (1e-5), logged.

    Returns:
        ``{"repro_inputs": path, "repro_golden": path, "repro_model": path, "repro_command": the
        polygraphy command line}`` for the files written (``repro_model`` only with ``as_run``), each under the first
        free name (``reduced_inputs_1.json`` when one is there: nothing is overwritten; golden only when
        every output's value is known without computing it, i.e. from the compare checker); empty
        when the bundle cannot be made (logged: polygraphy missing, or the original does not run).
    """
    from runner.files.artifacts import remove_partial
    from runner.files.reservations import reserve

    names_in = [i.name for i in reduced.graph.input]
    names_out = [o.name for o in reduced.graph.output]
    paths = bundle_paths(output)
    have_golden = all(all(n in s for n in names_out) for s in samples)
    written: Dict[str, str] = {}
    held: List[int] = []  # the reserved names' locks, held until their files are written

    def claim(path: Path) -> Path:
        target, fd = reserve(path)  # a free name: nothing there is ever overwritten
        held.append(fd)
        return target

    try:
        if all(all(n in s for n in names_in) for s in samples):
            inputs = [{n: np.asarray(s[n]) for n in names_in} for s in samples]
        elif original is not None:
            inputs = values_of(original, samples, names_in)
        else:
            return {}
        target = claim(paths["repro_inputs"])
        written["repro_inputs"] = str(target)
        save_input_samples(target, inputs)
        if have_golden:
            target = claim(paths["repro_golden"])
            written["repro_golden"] = str(target)
            save_golden_samples(target, [{n: np.asarray(s[n]) for n in names_out} for s in samples])
        ran = as_run(reduced) if as_run is not None else None
        model_path = output
        if ran is not None:
            model_path = claim(output.with_name(f"{output.stem}_{ran[1]}.onnx"))
            written["repro_model"] = str(model_path)
            save_model(ran[0], model_path)
        if have_golden:
            command = ["polygraphy", "run", str(model_path), "--onnxrt", "--load-inputs", written["repro_inputs"]]
            command += ["--load-outputs", written["repro_golden"], *(tolerance or [])]
            written["repro_command"] = shlex.join(command)
            if tolerance is None:
                log.info(
                    "repro_command judges at Polygraphy's default tolerance: the run's statistic has no equal there"
                )
    except (MissingExtraError, ModelError, InvalidCandidateError, OSError) as e:
        for key, made in written.items():
            if key != "repro_command":
                remove_partial(Path(made))
        log.warning("No repro bundle beside %s: %s", output, e)
        return {}
    finally:
        for fd in held:
            os.close(fd)
    files = [Path(p).name for k, p in written.items() if k != "repro_command"]
    log.info("Wrote the repro bundle beside %s: %s", output.name, ", ".join(files))
    return written
