"""What a run shares, built once in ``runner.run.app`` and handed to the strategy and the checker.

Expensive parts are made on first use and then kept: the loaded model, the input feeds, and the
fp32 values of every tensor (one ONNX Runtime run) that the shape fallback, precision's ranking
and ``checker=compare``'s golden values all need.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from runner.errors import ConfigError

if TYPE_CHECKING:  # NumPy, ONNX and the model's files are imported where first used: a run of no model needs none
    import numpy as np
    import onnx

    from runner.files.rankings import Rankings
    from runner.files.samples import Sample
    from runner.graph.summaries import TensorSummary

log = logging.getLogger(__name__)


#: the most samples a precision ranking runs on (``RunContext.ranking_samples``)
RANKING_SAMPLES = 8

#: the one line for ``iterations=`` beside ``inputs=``/``data_loader=``, whatever its value
ITERATIONS_WITH_SAMPLES = (
    "iterations= sets how many inputs are generated; inputs=/data_loader= give their own samples: drop iterations="
)


@dataclass
class RunContext:
    """One run's shared state.

    Args:
        mode: the mode's name.
        run_dir: the run's own directory (locked for the run).
        model_path: the model file (``model=``), or None for modes without one.
        model_files: the model file and the external data files it references (``runner.graph.model_files.model_files``,
            listed once per run), or empty.
        input_shapes: ``model_input_shapes=`` as given (validated against the model on first use).
        inputs: an ``.npz`` file or Polygraphy ``--save-inputs`` JSON of input samples
            (``inputs=``), or None.
        golden: an ``.npz`` file or Polygraphy ``--save-outputs`` JSON of golden values
            (``golden=``), or None.
        data_loader: ``pkg.module.fn`` returning an iterable of feed dicts (``data_loader=``), or None.
        max_samples: the most samples the data loader is read for (``data_loader_max_samples=``).
        max_sample_mb: the most megabytes of arrays it brings (``data_loader_max_mb=``).
        cuts_tensors: the mode's candidates may be subgraphs fed any tensor (reduce): every sample's golden values
            keep every tensor; otherwise a sample after the first keeps its inputs and compared outputs.
        val_range: the range of generated inputs (``val_range=``: ``[lo, hi]`` or ``{input: [lo, hi]}``).
        save_golden: where ``checker=compare`` saves the golden values it computed, or None.
        seed: the seed for generated inputs.
        iterations: how many samples are generated (``iterations=``, Polygraphy's ``--iterations``),
            the k-th from ``seed + k``.
        value_budget: bytes of tensor values one streamed run may hold (``summaries``).
        workers: checks that may run at once (``executor.workers``; 1 for the serial executor).
        lanes: where jobs that are not checks run (precision's ranking), as the executor offers
            (``Executor.lanes``, for ``runner.executors.spread.spread``); empty (the default): one in this thread.
        started: when the run started (``time.monotonic``), for ``budget.seconds``.
        identity: what the run's verdicts depend on (``runner.files.identity.run_identity``), for keys of what
            it keeps across runs (``rankings``).
        ranking_sources: earlier runs' ``ranking.json`` files (or run directories) to read rankings from.
    """

    mode: str
    run_dir: Path
    model_path: Optional[Path] = None
    model_files: Sequence[Path] = ()
    input_shapes: Optional[Mapping[str, Sequence[int]]] = None
    inputs: Optional[str] = None
    golden: Optional[str] = None
    save_golden: Optional[str] = None
    seed: int = 0
    data_loader: Optional[str] = None
    max_samples: int = 1000
    max_sample_mb: float = 64.0
    cuts_tensors: bool = False
    val_range: Any = None
    iterations: int = 1
    value_budget: int = 2**30
    workers: int = 1
    lanes: Sequence[Any] = ()
    started: float = field(default_factory=time.monotonic)
    identity: Mapping[str, Any] = field(default_factory=dict)
    ranking_sources: Sequence[Path] = ()

    def __post_init__(self) -> None:
        """Check what can be checked before any work.

        Raises:
            ConfigError: a negative ``seed``; ``iterations`` below 1, or other than 1 with ``inputs=`` or
                ``data_loader=``.
        """
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(
                f"seed={self.seed}: give a non-negative integer (numpy seeds the generated inputs with it)"
            )
        if self.iterations != 1 and (self.inputs or self.data_loader):
            raise ConfigError(ITERATIONS_WITH_SAMPLES)
        if not isinstance(self.iterations, int) or self.iterations < 1:
            raise ConfigError(f"iterations={self.iterations}: give how many input samples to generate, 1 or more")

    @functools.cached_property
    def rankings(self) -> Rankings:
        """The rankings this run reads (``ranking_sources``) and writes (``ranking.json`` in its directory):
        ``runner.files.rankings``."""
        from runner.files.rankings import FILE, Rankings

        return Rankings(self.run_dir / FILE, self.ranking_sources)

    @functools.cached_property
    def model(self) -> onnx.ModelProto:
        """The model as loaded (external data included); the file itself is never written.

        Raises:
            ModelError: no ``model=``, a missing file, or not ONNX.
        """
        from runner.graph.load import load_model

        return load_model(self.model_path)

    @functools.cached_property
    def loaded_inputs(self) -> Optional[List[Sample]]:
        """The raw samples of ``inputs=`` or ``data_loader=``, or None when inputs are not given.

        Raises:
            ConfigError: both given, ``val_range=`` with either, or an unreadable source.
        """
        from runner.files.samples import check_sources, load_input_samples, loader_samples

        check_sources(self.inputs, self.data_loader, self.val_range)
        if self.inputs:
            return load_input_samples(self.inputs)
        if self.data_loader:
            return loader_samples(self.data_loader, self.max_samples, self.max_sample_mb)
        return None

    @functools.cached_property
    def golden_samples(self) -> Optional[List[Sample]]:
        """The golden values of ``golden=`` per sample, or None.

        Raises:
            ConfigError: an unreadable file.
        """
        from runner.files.samples import load_golden_samples

        return load_golden_samples(self.golden) if self.golden else None

    def _source(self) -> str:
        return f"inputs={self.inputs}" if self.inputs else f"data_loader={self.data_loader}"

    def tensor_sizes(self, model: onnx.ModelProto, measure: bool = True) -> Dict[str, int]:
        """Bytes of each of ``model``'s top-level tensors in a run on these inputs (``value_sizes``:
        shape inference on ``shapes``, else the feeds' shapes).

        Args:
            model: the model (not modified).
            measure: for tensors inference leaves without a static shape, run ONNX Runtime once
                (``summaries``); False: leave them out.
        """
        import numpy as np

        from runner.graph.meta import value_sizes

        shapes = self.shapes or {k: list(np.shape(v)) for k, v in self.feeds.items()}
        return value_sizes(model, shapes, (lambda: self.summaries) if measure else None)

    @functools.cached_property
    def shapes(self) -> Dict[str, List[int]]:
        """The model's input shapes: ``model_input_shapes`` when given, else those of the first
        sample of ``inputs=``/``data_loader=`` or, failing that, ``golden=`` (so generated inputs and
        the shape fallback match the recorded values), checked against the model's inputs.

        Raises:
            ConfigError: an unknown input, a wrong rank or a negative dimension; a recorded array
                whose rank or fixed dimensions do not fit the model's input.
        """
        from runner.graph.feeds import check_input_shapes, recorded_shapes

        if self.input_shapes:
            return check_input_shapes(self.model, self.input_shapes)
        if self.loaded_inputs is not None:
            for i, sample in enumerate(self.loaded_inputs[1:], 1):
                recorded_shapes(self.model, sample, f"{self._source()} sample {i}")
            return recorded_shapes(self.model, self.loaded_inputs[0], self._source())
        if self.golden_samples is not None:
            return recorded_shapes(self.model, self.golden_samples[0], f"golden={self.golden}")
        return {}

    @functools.cached_property
    def samples(self) -> List[Dict[str, np.ndarray]]:
        """The model's input samples, each ``{input name: array}``: from ``inputs=`` or
        ``data_loader=``; else the inputs recorded in every ``golden=`` sample (``save_golden=``
        records them); else ``iterations`` samples generated from ``seed`` within ``val_range``.

        Raises:
            ConfigError: an unreadable source, or a sample lacking a model input.
        """
        from runner.files.samples import parse_val_range
        from runner.graph.feeds import generate_feeds, graph_inputs, input_specs, model_sample

        _ = self.shapes  # validates every loaded sample against the model first
        if self.loaded_inputs is not None:
            return [
                model_sample(self.model, s, f"{self._source()} sample {i}") for i, s in enumerate(self.loaded_inputs)
            ]
        names = [i.name for i in graph_inputs(self.model)]
        golden = self.golden_samples
        if golden and all(n in g for g in golden for n in names):
            return [model_sample(self.model, g, f"golden={self.golden}") for g in golden]
        ranges = parse_val_range(self.val_range, names)
        specs = input_specs(self.model, self.shapes)
        return [generate_feeds(specs, self.seed + k, ranges) for k in range(self.iterations)]

    @functools.cached_property
    def ranking_samples(self) -> List[Dict[str, np.ndarray]]:
        """The samples a ranking runs on: the first ``RANKING_SAMPLES`` (a ranking orders nodes, each check still
        judges every sample), said in one line when they are fewer than the run's. An order needs no more: on the
        README's detector with 54 rendered pages the ranking took 68 s of an 83 s run and ranked as 8 do.

        Raises:
            ConfigError: as ``samples``.
        """
        if len(self.samples) > RANKING_SAMPLES:
            log.info(
                "Ranking nodes on the first %d of %d samples; every check judges all %d",
                RANKING_SAMPLES, len(self.samples), len(self.samples),
            )  # fmt: skip
        return self.samples[:RANKING_SAMPLES]

    @functools.cached_property
    def feeds(self) -> Dict[str, np.ndarray]:
        """The first input sample (the one the strategy's ranking and the shape fallback run on).

        Raises:
            ConfigError: as ``samples``.
        """
        return self.samples[0]

    @functools.cached_property
    def activations(self) -> Dict[str, np.ndarray]:
        """The fp32 value of every top-level tensor (inputs and node outputs) from one ONNX Runtime
        CPU run of the model on ``feeds``.

        Raises:
            ModelError: ONNX Runtime cannot run the model.
        """
        from runner.graph.activations import run_all_tensors

        return run_all_tensors(self.model, self.feeds)

    @functools.cached_property
    def summaries(self) -> Dict[str, TensorSummary]:
        """Dtype, shape and peak magnitude of every top-level tensor on ``feeds``: from ``activations``
        when they were already made, else streamed in chunks within ``value_budget`` bytes.

        Raises:
            ModelError: ONNX Runtime cannot run the model.
        """
        from runner.graph.summaries import summarize, tensor_summaries

        if "activations" in self.__dict__:
            return {name: summarize(value) for name, value in self.activations.items()}
        return tensor_summaries(self.model, self.feeds, self.value_budget)
