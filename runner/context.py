"""What a run shares, built once in ``runner.app`` and handed to the strategy and the checker.

Expensive parts are made on first use and then kept: the loaded model, the input feeds, and the
fp32 values of every tensor (one ONNX Runtime run) that the shape fallback, precision's ranking
and ``checker=compare``'s golden values all need.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.graph.activations import run_all_tensors
from runner.graph.feeds import check_input_shapes, load_npz, model_feeds, recorded_shapes
from runner.graph.load import load_model
from runner.graph.summaries import TensorSummary, summarize, tensor_summaries


@dataclass
class RunContext:
    """One run's shared state.

    Args:
        mode: the mode's name.
        run_dir: the run's own directory (locked for the run).
        model_path: the model file (``model=``), or None for modes without one.
        model_files: the model file and the external data files it references (``runner.outputs.model_files``,
            listed once per run), or empty.
        input_shapes: ``model_input_shapes=`` as given (validated against the model on first use).
        inputs: an ``.npz`` file of model inputs (``inputs=``), or None to generate them.
        golden: an ``.npz`` file of golden values (``golden=``), or None.
        save_golden: where ``checker=compare`` saves the golden values it computed, or None.
        seed: the seed for generated inputs.
        value_budget: bytes of tensor values one streamed run may hold (``summaries``).
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
    value_budget: int = 2**30

    @functools.cached_property
    def model(self) -> onnx.ModelProto:
        """The model as loaded (external data included); the file itself is never written.

        Raises:
            ModelError: no ``model=``, a missing file, or not ONNX.
        """
        return load_model(self.model_path)

    @functools.cached_property
    def shapes(self) -> Dict[str, List[int]]:
        """The model's input shapes: ``model_input_shapes`` when given, else those of the arrays in
        ``inputs=`` or, failing that, ``golden=`` (so generated inputs and the shape fallback match
        the recorded values), checked against the model's inputs.

        Raises:
            ConfigError: an unknown input, a wrong rank or a negative dimension; a recorded array
                whose rank or fixed dimensions do not fit the model's input.
        """
        if self.input_shapes:
            return check_input_shapes(self.model, self.input_shapes)
        for option, path in (("inputs", self.inputs), ("golden", self.golden)):
            if path:
                return recorded_shapes(self.model, load_npz(path, option), f"{option}={path}")
        return {}

    @functools.cached_property
    def feeds(self) -> Dict[str, np.ndarray]:
        """The model's inputs: loaded from ``inputs=`` or generated from the seed and shapes.

        Raises:
            ConfigError: an unreadable ``inputs=`` file, or one lacking a model input.
        """
        return model_feeds(self.model, self.shapes, self.inputs, self.seed)

    @functools.cached_property
    def activations(self) -> Dict[str, np.ndarray]:
        """The fp32 value of every top-level tensor (inputs and node outputs) from one ONNX Runtime
        CPU run of the model on ``feeds``.

        Raises:
            ModelError: ONNX Runtime cannot run the model.
        """
        return run_all_tensors(self.model, self.feeds)

    @functools.cached_property
    def summaries(self) -> Dict[str, TensorSummary]:
        """Dtype, shape and peak magnitude of every top-level tensor on ``feeds``: from ``activations``
        when they were already made, else streamed in chunks within ``value_budget`` bytes.

        Raises:
            ModelError: ONNX Runtime cannot run the model.
        """
        if "activations" in self.__dict__:
            return {name: summarize(value) for name, value in self.activations.items()}
        return tensor_summaries(self.model, self.feeds, self.value_budget)
