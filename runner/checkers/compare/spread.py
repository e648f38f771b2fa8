"""Whether the reference can carry a low-precision verdict: the fp32 model's own spread between arithmetics.

A precision search judges each candidate against golden outputs by a tolerance. When the fp32 model itself
moves by more than that tolerance between two ways of computing it, no verdict says anything about the low
precision: on the detector fed generated inputs (every output about 2e-7) ONNX Runtime's two CPU optimization
levels differ by rel L2 0.67, and a search at rel L2 0.01 spent 348 checks keeping 325 of 330 nodes; decoders
whose attention logits are about 1e6 move by 17-25% between the levels, and a detector whose boxes are nearly
tied flips one. So before the search (and before its ranking) the fp32 model runs once more per sample on each
arithmetic of ``arithmetics_of``: the candidates' own (the checker's backend and optimization level, where it is
not the reference's) and ONNX Runtime on the checker's providers at the other optimization level; each run is
judged against the golden outputs at the full tolerance, as a candidate would be. Any failure is one line
naming the output, the spread and what to do (``UnstableReferenceError``). Torch's accuracy minifier trusts only
what an fp64 reference confirms; here the two fp32 arithmetics a deployment meets are the witnesses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.backends.base import Backend, make_backend
from runner.checkers.compare.arithmetics import Judge, judged_samples
from runner.errors import ConfigError, ModelError

#: what to do about a reference that is only noise
ADVICE = (
    "give real inputs where they were generated (inputs=, data_loader=), an atol for outputs near 0, or a tolerance "
    "above that spread"
)
#: ... when detections are judged: a box that flips in fp32 flips in any precision
DETECTION_ADVICE = (
    "judge the detections with room for the boxes that flip (checker.detections with max_unmatched=), or compare "
    "the tensors before the decision (checker.outputs=[...])"
)


class UnstableReferenceError(ConfigError):
    """The fp32 model moves by more than the tolerance between two arithmetics: no low-precision verdict holds."""


@dataclass(frozen=True)
class Witness:
    """One arithmetic the fp32 model is run on besides the reference's.

    Attributes:
        name: as the log and ``summary.json`` name it (``the candidates' arithmetic (fp16_emulation, level
            disable)``, ``ONNX Runtime level disable``).
        make: builds its backend (the caller closes it); None: the checker's own backend.
    """

    name: str
    make: Optional[Callable[[], Backend]]


def witnesses(
    backend_name: str, level: str, providers: Sequence[str], provider_options: Optional[Mapping[str, Any]]
) -> List[Witness]:
    """The arithmetics the fp32 model is measured on: the candidates' own unless it is the reference's (ONNX
    Runtime on the CPU at level ``all``), and ONNX Runtime on ``providers`` at the other level.

    Args:
        backend_name: the checker's backend (``checker.backend``).
        level: its graph optimization level.
        providers, provider_options: its ONNX Runtime providers and their options.
    """
    found: List[Witness] = []
    cpu_all = backend_name == "onnxruntime" and list(providers) == ["CPUExecutionProvider"] and level == "all"
    if not cpu_all:
        found.append(Witness(f"the candidates' arithmetic ({backend_name}, level {level})", None))
    other = "disable" if level != "disable" else "all"

    def make() -> Backend:
        return make_backend(
            "onnxruntime", providers=list(providers), graph_optimization_level=other, provider_options=provider_options
        )

    where = "" if list(providers) == ["CPUExecutionProvider"] else f" on {', '.join(providers)}"
    found.append(Witness(f"ONNX Runtime level {other}{where}", make))
    return found


def measure(
    model: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    feeds_of: Callable[[Mapping[str, np.ndarray]], Dict[str, np.ndarray]],
    compared: Sequence[str],
    judge: Judge,
    own: Backend,
    on: Sequence[Witness],
    advice: str = ADVICE,
) -> Dict[str, Dict[str, float]]:
    """Run the fp32 ``model`` on every sample on each witness and judge it at the full tolerance.

    Args:
        model: the fp32 model (every node kept: what the all-kept candidate is).
        samples: each sample's inputs and golden values, by tensor name.
        feeds_of: the model's feeds of one sample.
        compared: the tensors compared.
        judge: the checker's judgement at the full tolerance.
        own: the checker's backend (for the witness without ``make``).
        on: the witnesses.
        advice: what to do, for the error (``ADVICE``; ``DETECTION_ADVICE`` for detections).

    Returns:
        ``{witness name: {output: the worst statistic over the samples}}``.

    Raises:
        UnstableReferenceError: a witness's run breaks the tolerance: names the output, the spread, the
            arithmetic and what to do.
    """
    found: Dict[str, Dict[str, float]] = {}
    for witness in on:
        backend = witness.make() if witness.make is not None else own
        worst: Dict[str, float] = {}
        runs = judged_samples(backend, model, samples, feeds_of, compared, judge, f"spread:{witness.name}", worst)
        try:
            for index, passed, problem in runs:
                if not passed:
                    where = f" on sample {index}" if len(samples) > 1 else ""
                    raise UnstableReferenceError(
                        f"the fp32 model itself moves past the tolerance between its golden outputs and "
                        f"{witness.name}{where} ({problem}): that is the reference's own noise, and no low-precision "
                        f"candidate can be judged within it; {advice}"
                    )
        except ModelError:
            pass  # an arithmetic that cannot run the model says nothing of its spread (its samples so far stand)
        finally:
            if witness.make is not None:
                backend.close()
        found[witness.name] = worst
    return found
