"""``checker=validate``: a check without golden outputs. The candidate runs on the run's input samples and fails
when an output holds NaN or Inf (Polygraphy's ``polygraphy run --validate``).

The golden-free question of a low-precision search: which nodes must stay in fp32 so that nothing overflows
(``mode=precision checker=validate``), or which subgraph still produces a NaN (``mode=reduce``). Only the inputs of
a candidate come from the fp32 model (a reduce subgraph's inputs are tensors of the model, run once per sample
and only as far as the candidates need); its outputs are judged alone. Nothing here compares values: a
candidate that is finite but wrong passes, which is what was asked (``checker=compare`` judges values).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import onnx

from runner.backends.base import Backend, make_backend, onnxruntime_options
from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker, Need, conf_of
from runner.checkers.compare.lowering import as_run, warn_fp16_on_cpu
from runner.checkers.compare.outputs import check_compared, compared
from runner.checkers.on_error import OnError
from runner.config import ValidateCheckerConf
from runner.context import RunContext
from runner.errors import ConfigError, ModelError
from runner.executors.slot import Slot
from runner.graph.activations import marked, run_tensors
from runner.graph.feeds import as_declared, graph_inputs
from runner.graph.load import load_model
from runner.lowp.precisions import emulated_by

log = logging.getLogger(__name__)


class ValidateChecker(Checker):
    """Fails a candidate whose checked outputs hold NaN or Inf on any input sample (module docstring).

    Args:
        conf: the checker's schema, ``runner.config.ValidateCheckerConf`` (``ValidateChecker.of(**keys)``
            fills it), whose keys mean:

    Keys:
        backend: what runs the candidate (``runner.backends``: onnxruntime, fp16_emulation, ...); an fp32 candidate
            on a backend that emulates a precision (fp16_emulation) runs converted to it, as ``checker=compare``'s.
        providers: ONNX Runtime's execution providers (CUDA: the candidate as the GPU computes it).
        outputs: check these tensors (any of the model's) instead of the graph outputs.
        exclude_outputs: leave these out.
        on_error: a candidate the backend cannot run: fail (the default), pass, or stop.

    Raises:
        ConfigError: an unknown backend or option of it; names refused as ``checker=compare`` refuses them.
        MissingExtraError: backend=tensorrt without TensorRT.
    """

    schema = ValidateCheckerConf
    fix_hint = "check that the model as given has no NaN or Inf in the outputs checked (checker.outputs)"
    verdict_by_bytes = True  # the samples are the run's: the verdict is a function of the candidate's file
    reads_model = True

    def __init__(self, conf: ValidateCheckerConf):
        providers = [str(p) for p in conf.providers]
        options = onnxruntime_options(conf.backend, providers=providers)
        if not options and providers != ["CPUExecutionProvider"]:
            raise ConfigError(f"checker.backend={conf.backend} does not run on ONNX Runtime: drop checker.providers")
        self.backend_name = conf.backend
        self.backend: Backend = make_backend(conf.backend, **options)
        #: the precision the backend emulates (fp16_emulation: float16): an fp32 candidate runs in it, as compare's do
        self.low = emulated_by(conf.backend)
        self.outputs = [str(o) for o in conf.outputs]
        self.exclude_outputs = {str(o) for o in conf.exclude_outputs}
        self.on_error = OnError(conf.on_error)
        self.samples: List[Dict[str, np.ndarray]] = []
        #: ONNX Runtime on CPU computes fp16 in fp32 where it lacks kernels, hiding overflows: warned of once a run
        self._warn_fp16 = conf.backend == "onnxruntime" and providers == ["CPUExecutionProvider"]
        self._model: Optional[onnx.ModelProto] = None
        #: ``{sample index: {tensor: value}}``: tensors of the model a candidate takes as inputs, run once each
        self._inputs: Dict[int, Dict[str, np.ndarray]] = {}

    @classmethod
    def of(cls, **keys: Any) -> ValidateChecker:
        """A checker of ``keys`` (the schema's), the rest at their one default (``runner.checkers.base.conf_of``).

        Raises:
            ConfigError: a key the schema does not have, a value of the wrong type, or what the checker refuses.
        """
        return cls(conf_of(ValidateCheckerConf, keys))

    def bind(self, ctx: RunContext) -> None:
        """Take the run's input samples and its model (whose tensors feed a subgraph candidate).

        Raises:
            ConfigError: ``outputs``/``exclude_outputs`` name no tensor of the model or leave nothing to check;
                bad samples.
        """
        model = ctx.model
        tensors = {o for n in model.graph.node for o in n.output} | {o.name for o in model.graph.output}
        unknown = sorted((set(self.outputs) | self.exclude_outputs) - tensors)
        if unknown:
            raise ConfigError(
                f"checker.outputs/exclude_outputs name {unknown}, which no node of the model computes; "
                "name tensors of the model"
            )
        check_compared(model, self.outputs, self.exclude_outputs)
        self._model, self.samples = model, list(ctx.samples)
        log.info(
            "Each candidate passes while its %s hold no NaN or Inf on %d input sample(s); nothing is compared",
            "tensors " + ", ".join(self.outputs) if self.outputs else "outputs",
            len(self.samples),
        )

    def needs(self, candidate: Candidate) -> Need:
        """The in-memory model where the candidate has one, else its file."""
        return Need.model if candidate.payload is not None else Need.file

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Run the candidate on every sample; it fails at the first output holding NaN or Inf.

        Raises:
            ConfigError: a tensor the candidate takes as input that the model does not compute.
            CheckError: the backend cannot run it and ``on_error`` is "stop".
        """
        model = candidate.payload() if candidate.payload is not None else load_model(artifact, "iteration artifact")
        # an fp32 candidate on fp16_emulation runs in float16, as compare's does; a precision candidate as written
        lowered = None if candidate.as_typed else as_run(model, self.low, emulating=True)
        model = lowered[0] if lowered is not None else model
        if self._warn_fp16 and warn_fp16_on_cpu(model):
            self._warn_fp16 = False
        wanted = compared(model, self.outputs, self.exclude_outputs)
        if not wanted:
            return Verdict(True, reason="the candidate computes none of the checked tensors (checker.outputs)")
        run = marked(model, wanted) if wanted != [o.name for o in model.graph.output] else model
        key = f"{candidate.key}:validate:{','.join(wanted)}"
        inputs = graph_inputs(model)
        for index, sample in enumerate(self.samples):
            values = self._feeds(index, sample, [i.name for i in inputs])
            feeds = {i.name: as_declared(values[i.name], i.type.tensor_type.elem_type) for i in inputs}
            try:
                got = self.backend.run(run, feeds, key=key)
            except ModelError as e:
                return self.on_error.cannot_run(iteration, self.backend_name, e)
            bad = _nonfinite(got, wanted)
            if bad:
                where = f" on sample {index}" if len(self.samples) > 1 else ""
                which = index if len(self.samples) > 1 else None
                return Verdict(False, reason="; ".join(bad) + where, details={"nonfinite": bad}, sample=which)
        several = f" on all {len(self.samples)} samples" if len(self.samples) > 1 else ""
        return Verdict(True, reason=f"no NaN or Inf in {len(wanted)} tensor(s){several}")

    def _feeds(self, index: int, sample: Dict[str, np.ndarray], names: List[str]) -> Dict[str, np.ndarray]:
        """The values of ``names`` for sample ``index``: the sample's own, else tensors of the model computed
        from it (a subgraph candidate's inputs), each run once per sample.

        Raises:
            ConfigError: a name the model neither takes nor computes.
        """
        missing = [n for n in names if n not in sample and n not in self._inputs.get(index, {})]
        if missing:
            assert self._model is not None, "bind comes before the first check"
            computed = {o for n in self._model.graph.node for o in n.output}
            unknown = [n for n in missing if n not in computed]
            if unknown:
                raise ConfigError(f"the candidate takes inputs {unknown} that the model neither takes nor computes")
            self._inputs.setdefault(index, {}).update(run_tensors(self._model, sample, missing))
        return {**self._inputs.get(index, {}), **sample}

    def close(self) -> None:
        """Release the backend's sessions."""
        self.backend.close()


def _nonfinite(got: Dict[str, np.ndarray], wanted: List[str]) -> List[str]:
    """One "name: N NaN, M Inf of K values" line for each float tensor of ``wanted`` in ``got`` holding any."""
    lines = []
    for name in wanted:
        value = np.asarray(got.get(name))
        if value.dtype.kind != "f" or value.size == 0:
            continue
        nan, inf = int(np.count_nonzero(np.isnan(value))), int(np.count_nonzero(np.isinf(value)))
        if nan or inf:
            lines.append(f"{name}: {nan} NaN, {inf} Inf of {value.size} values")
    return lines
