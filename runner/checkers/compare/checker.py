"""The compare checker: run each candidate in-process and compare its outputs with golden outputs.

No subprocess per iteration: sessions, the inputs and the golden values are made once. In
reduce mode a subgraph's inputs are fed the values the original model produced for those
tensors, and its outputs are compared with the original model's values for them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend, backend_class, make_backend, onnxruntime_options
from runner.backends.fp16_emulation import EmulationBackend
from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker, Need, conf_of
from runner.checkers.compare.arithmetics import Arithmetic, arithmetics, margin_of, verify
from runner.checkers.compare.comparison import Comparison
from runner.checkers.compare.detections import DetectionRule
from runner.checkers.compare.golden_casts import through_casts
from runner.checkers.compare.judge import Judge
from runner.checkers.compare.lowering import Lowering
from runner.checkers.compare.noise import NoiseFloor
from runner.checkers.compare.outputs import check_compared, check_names, compared
from runner.checkers.compare.reference import reference_run, reference_samples
from runner.checkers.compare.spread import ADVICE, DETECTION_ADVICE, measure, witnesses
from runner.checkers.compare.switched import SwitchedRuns
from runner.checkers.compare.tolerance import Tolerances
from runner.checkers.on_error import OnError
from runner.config import CompareCheckerConf, plain
from runner.context import RunContext
from runner.errors import ConfigError, ModelError
from runner.executors.slot import Slot
from runner.executors.worker import warm_also
from runner.files.samples import check_golden, save_golden_samples
from runner.graph.activations import marked, run_tensors
from runner.graph.decisions import data_dependent_outputs
from runner.graph.feeds import as_declared, graph_inputs
from runner.graph.load import load_model
from runner.graph.qdq import has_qdq
from runner.graph.weight_file import weight_bytes
from runner.lowp.convert import has_low_precision
from runner.lowp.precisions import LowPrecision, any_low_precision, emulated_by
from runner.lowp.switchboard import RunsOn, Switchboard
from runner.terminal.stretch import stretch

log = logging.getLogger(__name__)
warm_also(__name__)  # worker processes import this module while they warm (runner.executors.worker)

#: the schema's provider options (what "not given" means for a backend outside ONNX Runtime)
_schema_default = CompareCheckerConf().provider_options


class CompareChecker(Checker):
    """Judges a candidate by comparing its outputs with golden outputs, per output tensor.

    A candidate fails when any output has NaN/Inf where the golden value has none, or breaks the
    tolerance by the chosen statistic (``runner.checkers.compare.tolerance``: by default more than
    ``max_mismatch_fraction`` of its elements outside ``atol + rtol * |golden|``), or when the
    backend cannot run it.

    Args:
        conf: the checker's schema, ``runner.config.CompareCheckerConf`` (``CompareChecker.of(**keys)`` fills it),
            whose keys mean:

    Keys:
        backend: the backend that runs candidates (onnxruntime, onnx_reference, fp16_emulation,
            bf16_emulation, tensorrt).
        reference: the backend that computes golden outputs from the original model.
        atol: absolute tolerance, or ``{output name: value, default: value}``.
        rtol: relative tolerance, or a map as ``atol``.
        max_mismatch_fraction: fraction of elements (0 to 1) allowed outside tolerance (elemwise).
        check_error_stat: elemwise, max, mean, median, quantile or rel_l2 (Polygraphy's
            ``--check-error-stat``, plus the scale-free relative L2 error).
        error_quantile: the quantile for ``check_error_stat=quantile``.
        on_error: a candidate the backend cannot run (invalid dimensions, unsupported op) counts
            as a failure ("fail", as Polygraphy counts a crash), a pass ("pass"), or stops the run
            ("stop"); such verdicts are marked ``error`` and counted apart in the summary.
        low_precision: float16 or bfloat16: a candidate with no low-precision tensors (an fp32
            model or subgraph) is converted with the project's converter (every float tensor and
            weight in that type, graph input/output types kept) before it runs, as TensorRT's
            ``--fp16`` would run it; implied by fp16_emulation / bf16_emulation. Candidates marked
            ``as_typed`` (precision mode) run as they are. int8: QDQ candidates run as they
            are; an fp32 one is an error (mode=layerwise quantizes with its own calibration).
        providers: ONNX Runtime providers for backends that use it.
        graph_optimization_level: ONNX Runtime optimization level for the candidate backend; None:
            "all", but "disable" for fp16_emulation and bf16_emulation (their rounding Casts run as
            written, and switched runs give each candidate's own bits; ``runner.run.plan`` gives
            "disable" to int8 precision runs with TensorRT's placement for the same reason).
        provider_options: ``{provider: {option: value}}`` for the candidate backend's ONNX Runtime
            providers (see ``runner.backends.onnxruntime.OnnxRuntimeBackend``).
        outputs: compare these tensors instead of the candidate's graph outputs: any tensors of the
            model, graph outputs or intermediate (a detector's scores and boxes before NMS), marked as
            outputs of each candidate that computes them (Polygraphy's ``--onnx-outputs``); a
            candidate that computes none of them shows nothing to fail and passes (a reduce subgraph).
        exclude_outputs: leave these graph outputs out of the comparison (``--onnx-exclude-outputs``).
        detections: judge detections instead of arrays (``runner.checkers.compare.detections``):
            ``{boxes: name, scores: name, labels: name, iou: 0.5, score_atol: 0.05, min_score: 0,
            max_unmatched: 0}``.
        noise_floor: when an fp32 candidate fails on ONNX Runtime, run it once more in another
            reduction order and pass it if it shows only fp32 re-association noise, which the
            reference itself cannot tell from a fault (``runner.checkers.compare.noise``). Candidates in a
            low precision are never judged so.
        switchboard: run precision's candidates as feeds of one switched model
            (``runner.checkers.compare.switched``) where that gives their own values: on CPU fp16 and bf16 ones
            with ``fp16_emulation`` or ``bf16_emulation``, int8 ones of TensorRT's placement with ``onnxruntime``;
            on a device (CUDA's provider) fp16 and bf16 ones with ``onnxruntime`` at level "disable".
        margin: the fraction (0 to 1) of the tolerance a precision candidate (``as_typed``) leaves free: it
            passes only within atol and rtol times ``1 - margin``, so that its answer holds on other
            arithmetics; None: ``runner.checkers.compare.arithmetics.AUTO_MARGIN`` (0.33) for int8 (Q/DQ)
            candidates, 0 for others.
        verify_on: the arithmetics (``cpu:disable``, ``cpu:all``, ``cuda:all``, ...) the written precision
            answer is run on and judged at the full tolerance (``Verdict.verified``); None: for an int8
            answer both CPU levels and the CUDA provider where it runs here, for others none.

    Raises:
        ConfigError: for negative tolerances, a fraction outside [0, 1), an unknown statistic or
            backend.
        MissingExtraError: for tensorrt without TensorRT installed.
    """

    schema = CompareCheckerConf
    reads_model = True

    def __init__(self, conf: CompareCheckerConf):
        backend, reference, providers = conf.backend, conf.reference, list(conf.providers)
        provider_options = conf.provider_options
        implied = emulated_by(backend)
        #: the low precision fp32 candidates run in (int8: QDQ models, quantized by the mode), or None
        self.low: Optional[LowPrecision] = any_low_precision(conf.low_precision, "checker.low_precision") or implied
        level = conf.graph_optimization_level
        graph_optimization_level = level.value if level is not None else ("disable" if implied else "all")
        self.on_error = OnError(conf.on_error)
        self.rule = Tolerances(
            conf.atol, conf.rtol, conf.check_error_stat.value, conf.error_quantile, conf.max_mismatch_fraction
        )
        options = onnxruntime_options(
            backend,
            providers=providers,
            graph_optimization_level=graph_optimization_level,
            provider_options=provider_options,
        )
        on_ort = bool(options) or backend_class(reference).on_onnxruntime
        if not on_ort and (providers != ["CPUExecutionProvider"] or provider_options != _schema_default):
            raise ConfigError(
                f"checker.backend={backend} and checker.reference={reference} do not run on ONNX Runtime: "
                "checker.providers and checker.provider_options do not apply; drop them"
            )
        self.backend: Backend = make_backend(backend, **options)
        #: the ONNX Runtime options ``backend`` was made with (``Comparison.backend``)
        self.backend_options = options
        self.backend_name = backend
        self.reference_name = reference
        self.providers = providers
        self.provider_options = provider_options
        self.samples: List[Dict[str, np.ndarray]] = []
        self._made: Optional[List[Dict[str, np.ndarray]]] = None  # ``_golden``: made once
        #: ``trust_reference``'s measure: ``{arithmetic: {output: worst statistic}}``
        self.spread: Dict[str, Dict[str, float]] = {}
        self.noise_floor = bool(conf.noise_floor)
        self._golden_made_here = False  # bind: the golden values come from this checker's reference run
        self.outputs = [str(o) for o in conf.outputs]
        self.exclude_outputs = {str(o) for o in conf.exclude_outputs}
        self.detections = DetectionRule.from_config(plain(conf.detections))
        self.judge = Judge(self.rule, self.detections)
        self._noise = NoiseFloor(graph_optimization_level, self.providers, provider_options)
        named = self.outputs + (self.detections.tensors() if self.detections else [])
        only_cpu = self.providers == ["CPUExecutionProvider"]
        self.switched = SwitchedRuns(self.backend, conf.switchboard, only_cpu, graph_optimization_level, named)
        emulating = isinstance(self.backend, EmulationBackend)
        self.lowering = Lowering(self.low, emulating, backend == "onnxruntime" and only_cpu)
        margin_of(conf.margin, False)  # refuses a margin outside [0, 1) before the run starts
        self.margin = None if conf.margin is None else float(conf.margin)
        self.verify_on = None if conf.verify_on is None else [Arithmetic.parse(n).name for n in conf.verify_on]

    @classmethod
    def of(cls, **keys: Any) -> CompareChecker:
        """A checker of ``keys`` (the schema's, as on the command line: ``backend="fp16_emulation"``,
        ``check_error_stat="rel_l2"``), the rest at their one default (``runner.checkers.base.conf_of``).

        Raises:
            ConfigError: a key the schema does not have, a value of the wrong type, or what the checker refuses.
        """
        return cls(conf_of(CompareCheckerConf, keys))

    def bind(self, ctx: RunContext) -> None:
        """Make the input samples and their golden values once: loaded (``golden=``) or from the
        reference run of each sample.

        Raises:
            ModelError: the original model cannot be loaded or run on the reference backend.
            ConfigError: a tolerance named for a tensor the model does not have; unreadable
                ``inputs=``/``golden=`` files; golden values without the inputs
                they were made from, or a different number of samples; golden values lacking an
                output of the model.
            ArtifactError: ``save_golden=`` cannot be written.
        """
        model = ctx.model
        check_names(model, self._named() + sorted(self.exclude_outputs), self.rule)
        check_compared(model, self._named(), self.exclude_outputs)
        if self.verify_on is not None:
            arithmetics(self.verify_on, False)  # a provider that does not run here is refused before the search
        self.switched.bind(model)
        self.judge.decisions = data_dependent_outputs(model)
        for name, decision in self.judge.decisions.items():
            log.info("Output %s has a data-dependent shape: %s", name, decision.hint())
        self.samples = self._golden(ctx)
        if len(self.samples) > 1:
            several = len(self.samples)
            log.info("Each candidate is checked on %d input samples; it passes only if every one does", several)
        if ctx.save_golden:
            save_golden_samples(ctx.save_golden, self.samples)
            log.info("Saved %d golden tensors per sample to %s", len(self.samples[0]), ctx.save_golden)

    def _golden(self, ctx: RunContext) -> List[Dict[str, np.ndarray]]:
        """Each sample's inputs and golden values, by tensor name: loaded (``golden=``) or from the reference
        run of each sample; made once (``trust_reference`` may make them before ``bind``).

        Raises:
            ConfigError, ModelError: as ``bind``.
        """
        if self._made is not None:
            return self._made
        model, samples, golden = ctx.model, ctx.samples, ctx.golden_samples
        self._golden_made_here = golden is None and self.reference_name == "onnxruntime"
        if golden is None:
            # the first sample keeps every tensor (the run's shared fp32 values); the others what checks need: all
            # where a candidate may be fed any tensor (reduce) or save_golden= keeps them for one, else their inputs
            # and compared outputs: a thousand samples hold a thousand outputs, not a thousand of every activation
            kept = None if ctx.cuts_tensors or ctx.save_golden else self._compared(model)
            golden = [self.reference_values(model, samples[0], ctx)]
            golden += reference_samples(
                self.reference_name, model, samples[1:], kept, self.providers, self.provider_options
            )
        else:
            check_golden(model, golden, samples, ctx.golden, bool(ctx.inputs or ctx.data_loader))
        made = [through_casts(model, {**feeds, **values}) for feeds, values in zip(samples, golden)]
        if self.detections is not None and all(t in made[0] for t in self.detections.tensors()):
            self.detections.check_shapes(made[0])
        self._made = made
        return made

    def trust_reference(self, ctx: RunContext) -> None:
        """Run the fp32 model on the candidates' arithmetic and ONNX Runtime's other optimization level, judged
        against the golden outputs at the full tolerance (``runner.checkers.compare.spread``); the worst statistic
        of each goes to ``summary.json``'s ``reference_spread``.

        Golden values loaded from a file (``golden=``) are no run of this model: the all-fp32 gate judges the model
        against them, and nothing is measured here.

        Raises:
            UnstableReferenceError: the model's own fp32 outputs move past the tolerance.
            ConfigError, ModelError: as ``bind``.
        """
        if ctx.golden:
            return
        model = ctx.model
        check_names(model, self._named() + sorted(self.exclude_outputs), self.rule)
        check_compared(model, self._named(), self.exclude_outputs)
        size = weight_bytes(model)
        with stretch("Running the fp32 model for the golden outputs", size):
            samples = self._golden(ctx)
        wanted = self._compared(model)
        declared = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
        names = [i.name for i in graph_inputs(model)]

        def feeds_of(sample: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
            return {n: as_declared(sample[n], declared.get(n)) for n in names}

        level = str(self.backend_options.get("graph_optimization_level", "all"))
        on = witnesses(self.backend_name, level, self.providers, self.provider_options)
        advice = DETECTION_ADVICE if self.detections is not None else ADVICE
        with stretch("Running the fp32 model on the candidates' arithmetic and the other optimization level", size):
            self.spread = measure(
                model, samples, feeds_of, wanted, self.judge.at_full_tolerance, self.backend, on, advice
            )
        for name, worst in self.spread.items():
            log.info(
                "The fp32 model on %s: within the tolerance (%s)",
                name,
                ", ".join(f"{n} {v:.3g}" for n, v in worst.items()),
            )

    @property
    def values(self) -> Dict[str, np.ndarray]:
        """The first sample's inputs and golden values, by tensor name."""
        return self.samples[0]

    def reference_values(
        self, model: onnx.ModelProto, feeds: Dict[str, np.ndarray], ctx: Optional[RunContext] = None
    ) -> Dict[str, np.ndarray]:
        """Every tensor's value from one reference run (``runner.checkers.compare.reference``); the run's shared
        fp32 values (``ctx.activations``) when ``ctx`` is given and the reference is ONNX Runtime on its feeds."""
        if self.reference_name == "onnxruntime" and ctx is not None:
            return ctx.activations
        return reference_run(self.reference_name, model, feeds, self.providers, self.provider_options)

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Run the candidate (its in-memory model, else the artifact file) on every sample and
        compare; it passes only if every sample passes (checking stops at the first that fails).

        Raises:
            ConfigError: when a tensor the candidate needs as input has no recorded value.
        InvalidCandidateError: converting the candidate to ``low_precision`` failed or made an
            invalid model (the tool's defect: no verdict).
        """
        board, switches = self.switched.board(candidate) or (None, {})
        if board is not None:
            model = board.model
        else:
            model = candidate.payload() if candidate.payload is not None else load_model(artifact, "iteration artifact")
            model = self.lowering.run_model(model, candidate.as_typed, iteration)
        names: List[str] = [i.name for i in graph_inputs(model) if i.name not in switches]
        missing = [n for n in names if n not in self.values]
        if missing:
            raise ConfigError(
                f"no recorded value for tensors {missing} that the candidate takes as inputs; "
                "let the checker compute golden values (drop golden=) or save them with save_golden="
            )
        declared = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
        wanted = self._compared(model)
        if not wanted:
            return Verdict(True, reason="the candidate computes none of the compared tensors (checker.outputs)")
        run_model, run_key = model, candidate.key
        quantized = self._quantized(board, model)
        margin = margin_of(self.margin, quantized) if candidate.as_typed and not candidate.as_reference else 0.0
        rule = self.rule.scaled(1 - margin) if margin else self.rule
        if board is None and wanted != [o.name for o in model.graph.output]:
            run_model, run_key = marked(model, wanted), f"{candidate.key}:outputs:{','.join(wanted)}"
        several = len(self.samples) > 1
        for index, values in enumerate(self.samples):
            feeds = {n: as_declared(values[n], declared.get(n)) for n in names}
            try:
                if candidate.as_reference and self._golden_made_here:
                    # the model the golden values came from, run as they were made: it gives them back
                    got = run_tensors(model, feeds, wanted)
                elif board is not None:
                    got = self.switched.run(board, switches, feeds, wanted)
                    if index == 0 and not self.switched.agrees(candidate, got, feeds, switches):
                        return self.check(artifact, iteration, candidate, slot)  # switched runs are off now
                else:
                    got = self.backend.run(run_model, feeds, key=run_key)
            except ModelError as e:
                return self.on_error.cannot_run(iteration, self.backend_name, e)
            unknown = [n for n in got if n not in values]
            if unknown:
                raise ConfigError(
                    f"no golden value for outputs {unknown}; let the checker compute golden values (drop golden=)"
                )
            where = f"Iteration {iteration}" + (f", sample {index}" if several else "")
            judged = self.judge.judge(got, values, rule, where)
            if judged.arrays_failed and self._judges_noise(model, candidate):
                floors = self._noise.floors(model, feeds, got, values, judged.stats, candidate.key)
                if floors is not None:
                    judged.within_noise(floors, where)
            judged.log(where)
            if not judged.passed:
                self.switched.counted(board is not None)
                return judged.failed(index if several else None, board is not None)
        what = "the detections match" if self.detections is not None else "all outputs within tolerance"
        reason = what + (f" with margin {margin:g}" if margin else "")
        reason += f" on all {len(self.samples)} samples" if several else ""
        verified = self._verified(candidate, model, quantized, margin, wanted, names, declared)
        self.switched.counted(board is not None)
        return Verdict(
            True,
            reason=reason,
            details=judged.found,
            outputs=judged.stats,
            switched=board is not None,
            verified=verified,
        )

    def _quantized(self, board: Optional[Switchboard], model: onnx.ModelProto) -> bool:
        """Whether the candidate runs in int8: Q/DQ as built, or on an int8 switchboard."""
        return self.switched.runs is RunsOn.ONNXRUNTIME if board is not None else has_qdq(model)

    def _verified(
        self,
        candidate: Candidate,
        model: onnx.ModelProto,
        quantized: bool,
        margin: float,
        wanted: List[str],
        names: List[str],
        declared: Dict[str, int],
    ) -> Optional[Dict[str, Any]]:
        """For a precision answer as written (``Candidate.info``'s ``answer``): its margin and its run on each
        arithmetic of ``verify_on`` at the full tolerance (``runner.checkers.compare.arithmetics.verify``); None for
        other candidates, or with no margin and nothing to verify on."""
        if not candidate.as_typed or "answer" not in candidate.info:
            return None
        on = arithmetics(self.verify_on, quantized)
        if not on and not margin:
            return None

        def feeds_of(sample: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
            return {n: as_declared(sample[n], declared.get(n)) for n in names}

        results = verify(model, self.samples, feeds_of, wanted, self.judge.at_full_tolerance, on, self.provider_options)
        return {"margin": margin, "on": results}

    def _compared(self, model: onnx.ModelProto) -> List[str]:
        """The tensors compared for ``model`` (``outputs.compared``)."""
        return compared(model, self._named(), self.exclude_outputs)

    def _named(self) -> List[str]:
        """``checker.outputs`` and the detection tensors."""
        return self.outputs + (self.detections.tensors() if self.detections else [])

    def as_run(self, model: onnx.ModelProto) -> Optional[Tuple[onnx.ModelProto, str]]:
        """How this checker runs an fp32 ``model`` when that is not as written: (the model it runs, a
        word for the file name), e.g. the float16 conversion rounded through Casts (``fp16_emulation``:
        any fp32 runtime reproduces it) or the float16 conversion (a backend with fp16 kernels); None
        when it runs the model as it is.

        Raises:
            InvalidCandidateError: the conversion failed (the tool's defect).
        """
        return self.lowering.as_run(model)

    def _judges_noise(self, model: onnx.ModelProto, candidate: Candidate) -> bool:
        """Whether a failing candidate is judged against the noise floor: fp32 on ONNX Runtime."""
        if not self.noise_floor or self.backend_name != "onnxruntime" or self.low is not None or candidate.as_typed:
            return False
        return not has_low_precision(model) and not has_qdq(model)

    def comparison(self) -> Comparison:
        """This checker's way of running and judging, as data (``runner.checkers.compare.comparison``)."""
        return Comparison(
            self.backend_name,
            dict(self.backend_options),
            tuple(self.providers),
            self.reference_name,
            self.low,
            self.rule,
            frozenset(self.exclude_outputs),
            lambda: self.samples,
            self.as_run,
        )

    def facts(self) -> Dict[str, Any]:
        """``switched_checks``: the checks this checker ran as feeds of a switched model, when any did;
        ``switched_disagreed`` with ``minimal: false`` and ``minimal_why`` when a cross-check found the switched
        model wrong after verdicts were taken from it; ``reference_spread``: the fp32 model's worst statistic on
        each arithmetic ``trust_reference`` measured."""
        found = self.switched.facts()
        if self.spread:
            found["reference_spread"] = self.spread
        return found

    def needs(self, candidate: Candidate) -> Need:
        """Nothing for a candidate that runs on its search's switchboard (``runner.checkers.compare.switched``), its
        in-memory model where it has one (``Candidate.payload``), else its file."""
        if self.switched.takes(candidate):
            return Need.nothing
        return Need.model if candidate.payload is not None else Need.file

    def close(self) -> None:
        """Release the backends' sessions."""
        self.backend.close()
        self._noise.close()
