"""Where an answer is verified: the ONNX Runtime arithmetics it will meet, and the margin it is searched with.

A 1-minimal precision answer sits at its threshold by construction (dropping any kept node fails
it), and another runtime's arithmetic moves it across: in int8 an fp32 rounding that crosses a
quantization step moves an int8 value. Measured on the bundled detector (``benchmarks/README.md``):
ONNX Runtime's two CPU optimization levels put one answer at rel L2 0.0497 and 0.0594, and on an
H100's CUDA provider every CPU answer of five tolerances failed its own, by 2-25%.

So the compare checker searches with a margin (a precision candidate passes only within the
tolerance scaled by ``1 - margin``) and verifies the written answer at the full tolerance on each
``Arithmetic`` of ``checker.verify_on``: a provider and a graph optimization level, named
``cpu:disable``, ``cpu:all``, ``cuda:all`` (``cpu`` and ``cuda`` alone mean level ``all``).
Left unset (``auto``), an int8 (Q/DQ) answer gets ``AUTO_MARGIN`` and is verified on both CPU
levels and, where ONNX Runtime's CUDA provider runs on this machine, on it.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.backends.base import make_backend
from runner.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

#: the margin an int8 answer is searched with when ``checker.margin`` is unset. It covers the spread measured
#: on the detector: ONNX Runtime's CPU levels 1.19x apart, the CUDA provider up to 1.39x the CPU's error
#: (an H200, ``benchmarks/int8_margin.py``); 1 / (1 - 0.33) = 1.49x
AUTO_MARGIN = 0.33
#: short provider names of ``checker.verify_on``
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
LEVELS = ("disable", "basic", "extended", "all")


@dataclass(frozen=True)
class Arithmetic:
    """One way ONNX Runtime computes a model: a provider and a graph optimization level.

    Attributes:
        name: as ``checker.verify_on`` names it, normalized (``cpu:all``).
        provider: ONNX Runtime's provider name (``CPUExecutionProvider``).
        level: the graph optimization level (``runner.config.GraphOptimization``'s names).
    """

    name: str
    provider: str
    level: str

    @classmethod
    def parse(cls, text: str) -> Arithmetic:
        """``cpu``, ``cpu:disable``, ``cuda:all``, ...

        Raises:
            ConfigError: an unknown provider or level.
        """
        short, _, level = str(text).strip().lower().partition(":")
        level = level or "all"
        if short not in PROVIDERS or level not in LEVELS:
            raise ConfigError(
                f"checker.verify_on names {text!r}: give PROVIDER:LEVEL with PROVIDER one of {', '.join(PROVIDERS)} "
                f"and LEVEL one of {', '.join(LEVELS)}, e.g. 'checker.verify_on=[cpu:disable,cpu:all,cuda]'"
            )
        return cls(f"{short}:{level}", PROVIDERS[short], level)


@functools.cache
def runs_here(provider: str) -> bool:
    """Whether ONNX Runtime's ``provider`` runs a model on this machine: listed by the installed build and
    kept by a session made with it (onnxruntime-gpu lists CUDA on a machine without a GPU, and its
    session falls back to the CPU). Asked once per process."""
    import onnxruntime as ort

    if provider == "CPUExecutionProvider":
        return True
    if provider not in ort.get_available_providers():
        return False
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    # IR version 7: the oldest ONNX Runtime build still in use reads it (onnx's default may be newer)
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=[provider, "CPUExecutionProvider"])
    except Exception:  # any failure to make the session means the provider does not run here
        return False
    return provider in session.get_providers()


def arithmetics(names: Optional[Sequence[str]], quantized: bool) -> List[Arithmetic]:
    """The arithmetics an answer is verified on.

    Args:
        names: ``checker.verify_on``; None (auto): for a ``quantized`` answer both CPU levels (``disable``,
            ``all``) and ``cuda:all`` where the CUDA provider runs here; for others none.
        quantized: whether the answer holds Q/DQ (int8).

    Returns:
        The arithmetics, each once, in the order given.

    Raises:
        ConfigError: a name ``Arithmetic.parse`` refuses, or one whose provider does not run here.
    """
    if names is None:
        if not quantized:
            return []
        found = [Arithmetic.parse("cpu:disable"), Arithmetic.parse("cpu:all")]
        return found + ([Arithmetic.parse("cuda:all")] if runs_here(PROVIDERS["cuda"]) else [])
    parsed = list({a.name: a for a in (Arithmetic.parse(n) for n in names)}.values())
    absent = [a.name for a in parsed if not runs_here(a.provider)]
    if absent:
        raise ConfigError(
            f"checker.verify_on names {absent}, whose ONNX Runtime provider does not run on this machine; "
            "install the build that has it (onnxruntime-gpu for cuda) or drop them"
        )
    return parsed


def margin_of(margin: Optional[float], quantized: bool) -> float:
    """The margin (0 to 1) a precision candidate is searched with: ``checker.margin``, or when None
    ``AUTO_MARGIN`` for a quantized (Q/DQ) candidate and 0 for others.

    Raises:
        ConfigError: a margin outside [0, 1).
    """
    if margin is None:
        return AUTO_MARGIN if quantized else 0.0
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ConfigError(
            f"checker.margin={margin!r}: give a fraction in [0, 1) of the tolerance to leave free while searching "
            "(0.25: a candidate passes within 0.75 of it), or null for the default"
        )
    return float(margin)


#: ``judge(outputs, sample) -> (passed, {output: the statistic compared}, the first problem or "")``
Judge = Callable[[Dict[str, np.ndarray], Mapping[str, np.ndarray]], Tuple[bool, Dict[str, float], str]]


def judged_samples(
    backend: Any,
    model: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    feeds_of: Callable[[Mapping[str, np.ndarray]], Dict[str, np.ndarray]],
    compared: Sequence[str],
    judge: Judge,
    key: str,
    worst: Dict[str, float],
) -> Iterator[Tuple[int, bool, str]]:
    """Run ``model`` on each sample on ``backend`` and judge it: ``(sample index, passed, the first problem)`` one
    sample at a time, ``worst`` (``{output: the largest statistic so far}``) updated before each.

    Raises:
        ModelError: the backend cannot run the model (from the sample it fails on).
    """
    for index, sample in enumerate(samples):
        got = backend.run(model, feeds_of(sample), key=key, outputs=list(compared))
        passed, statistics, problem = judge(got, sample)
        for name, value in statistics.items():
            worst[name] = max(worst.get(name, 0.0), float(value))
        yield index, passed, problem


def verify(
    model: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    feeds_of: Callable[[Mapping[str, np.ndarray]], Dict[str, np.ndarray]],
    compared: Sequence[str],
    judge: Judge,
    on: Sequence[Arithmetic],
    provider_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> Dict[str, Dict[str, Any]]:
    """Run ``model`` on every sample under each arithmetic of ``on`` and judge it.

    Args:
        model: the answer as written.
        samples: each sample's inputs and golden values, by tensor name.
        feeds_of: the model's feeds of one sample.
        compared: the tensors compared (graph outputs of ``model``).
        judge: the checker's judgement at the full tolerance (no margin).
        on: the arithmetics.
        provider_options: ``{provider: {option: value}}`` as the checker's.

    Returns:
        ``{arithmetic name: {"provider", "level", "passed", "reason", "statistic": {output: worst value
        over the samples}}}``; ``passed`` is False with the error as ``reason`` when ONNX Runtime cannot
        run it there.
    """
    found: Dict[str, Dict[str, Any]] = {}
    for arithmetic in on:
        providers = list(dict.fromkeys([arithmetic.provider, PROVIDERS["cpu"]]))  # the CPU for ops it lacks
        backend = make_backend(
            "onnxruntime",
            providers=providers,
            graph_optimization_level=arithmetic.level,
            provider_options=provider_options,
        )
        facts: Dict[str, Any] = {"provider": arithmetic.provider, "level": arithmetic.level, "passed": True}
        worst: Dict[str, float] = {}
        try:
            key = f"verify:{arithmetic.name}"
            for index, passed, problem in judged_samples(
                backend, model, samples, feeds_of, compared, judge, key, worst
            ):
                if not passed and facts["passed"]:
                    facts.update(passed=False, reason=(f"sample {index}: " if len(samples) > 1 else "") + problem)
        except ModelError as e:
            facts.update(passed=False, reason=f"ONNX Runtime cannot run it there: {e}")
        finally:
            backend.close()
        facts["statistic"] = worst
        log.info(
            "The answer on %s: %s (%s)",
            arithmetic.name,
            "within the full tolerance" if facts["passed"] else "OUTSIDE the full tolerance",
            ", ".join(f"{n} {v:.4g}" for n, v in worst.items()) or facts.get("reason", ""),
        )
        found[arithmetic.name] = facts
    return found
