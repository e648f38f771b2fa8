"""Candidates from a QDQ model another tool made (``quantized_model=``): its placement and scales as they are.

Users quantize with the tool of their runtime (NVIDIA ModelOpt for TensorRT, NNCF for OpenVINO, ONNX Runtime's
``quantize_static``) and come with that model when accuracy drops. It is ``model=`` with Q/DQ written in (and,
from some tools, a few initializers changed: NNCF's bias correction). ``GivenQuantizer`` reads it as ``model=``
plus, for each of ``model=``'s nodes, what the quantized model changes at its inputs:

- a Q/DQ chain (``QuantizeLinear -> DequantizeLinear`` of an activation, a weight's ``DequantizeLinear`` of its
  stored int8 or float8 values, or a fake-quantized weight's pair), copied with the given scales, zero points
  and quantized values;
- an initializer the tool changed (a corrected bias), read as the tool wrote it;
- and for a node whose output reaches a graph output through Q/DQ, that chain on its output.

A candidate keeps a set of nodes out of int8: each kept node is ``model=``'s node as it is (its float inputs,
weights and bias); every other node reads what the quantized model gives it. With no node kept the candidate
computes the quantized model itself (checked on the first sample when the run starts), and the search's units
are the nodes that read a DequantizeLinear. Being a sum of node choices, its candidates get a switchboard
(``runner.lowp.qdq_switchboard``) where no graph output is quantized.

The two models are matched node by node (``runner.lowp.given_match``); a model that does not match is refused
with the first difference named.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import onnx
from onnx import TensorProto

from runner.errors import ConfigError, ModelError, first_line
from runner.graph.meta import infer_shapes
from runner.graph.qdq import Chain
from runner.graph.stubs import weightless
from runner.lowp.emulate import tensor_types
from runner.lowp.given_match import read_given
from runner.lowp.placement import PlacedQuantizer, Site


class GivenQuantizer(PlacedQuantizer):
    """Builds candidates of a quantized model another tool made (module docstring), as the precision search's
    int8 builder (``convert(kept)``; its ``sites`` and ``qdq_inputs`` make the switchboard).

    Args:
        model: ``model=`` prepared (``prepare_int8`` at the quantized model's opset).
        quantized: the quantized model (``quantized_model=``), as loaded.
        option: the key that named it, for messages.

    Attributes:
        given: the reading of the quantized model (``read_given``).
        calibration: None: the scales are the tool's.

    Raises:
        ConfigError: as ``read_given``.
        ModelError: shape inference fails on ``model``.
    """

    def __init__(self, model: onnx.ModelProto, quantized: onnx.ModelProto, option: str = "quantized_model"):
        self.model, self.calibration, self.options = model, None, None
        self.given = read_given(model, quantized, option)
        self.bare, self.weights = weightless(model)
        try:
            typed = infer_shapes(self.bare)
        except Exception as e:  # onnx's inference raises InferenceError/ValidationError
            raise ModelError(f"shape inference fails on the model before quantization: {first_line(e)}") from None
        self.shapes = {
            v.name: [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            for v in list(typed.graph.value_info) + list(typed.graph.input) + list(typed.graph.output)
        }
        self.types = tensor_types(typed)
        self.inits = {i.name: i for i in model.graph.initializer}
        self.ranges = {}
        self._lock = threading.Lock()
        self._quantized = {}
        self.sites = {
            name: [Site(k, r.chain is not None and r.chain.source is None) for k, r in sorted(recipes.items())]
            for name, recipes in self.given.recipes.items()
        }
        for name in self.given.outputs:
            self.sites.setdefault(name, [])
        #: a candidate is a sum of input choices only where no graph output is quantized
        self.switchable = not self.given.outputs
        self._taken = {t for n in model.graph.node for t in (*n.input, *n.output)} | set(self.inits)
        self._names: Dict[str, str] = {}

    def _own(self, name: str) -> str:
        """The name a tensor of the quantized model takes in the candidates: its own, unless ``model=`` uses it."""
        if name not in self._names:
            out, k = name, 0
            while out in self._taken:
                k += 1
                out = f"{name}__given{k if k > 1 else ''}"
            self._taken.add(out)
            self._names[name] = out
        return self._names[name]

    def convert(self, kept: Sequence[str]) -> onnx.ModelProto:
        """The quantized model with the nodes named in ``kept`` as ``model=`` has them (out of int8).

        Raises:
            ModelError: as ``PlacedQuantizer.convert``.
        """
        out = super().convert(kept)
        keep = frozenset(kept)
        if not any(name not in keep for name in self.given.outputs):
            return out
        g = out.graph
        nodes: List[onnx.NodeProto] = []
        inits: List[TensorProto] = []
        present = {i.name for i in g.initializer}
        for node in g.node:
            nodes.append(node)
            for k, chain in self.given.outputs.get(node.name, {}).items():
                if node.name in keep:
                    continue
                final = node.output[k]
                node.output[k] = self._own(f"{final}__float")
                nodes.extend(self._copy(chain, node.output[k], final, inits, present, str))
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(inits)
        return out

    def qdq_inputs(
        self,
        node: onnx.NodeProto,
        made: Dict[Tuple[str, Optional[int], bool], str],
        nodes: List[onnx.NodeProto],
        inits: List[TensorProto],
        rename: Callable[[str], str] = str,
    ) -> Dict[int, str]:
        """What ``node`` reads at each input the quantized model changes: a copy of its Q/DQ chain (one per chain,
        shared by its readers through ``made``), or the tool's initializer.

        Args:
            made: ``{(chain's output, None, False): the copy's output}`` made so far; updated.
            rename: maps each new node's name and output (a switched node's branch); initializers keep their names.
        """
        reads: Dict[int, str] = {}
        present = {i.name for i in inits}
        for k, recipe in self.given.recipes.get(node.name, {}).items():
            if recipe.chain is None:
                assert recipe.init is not None
                reads[k] = self._const(recipe.init, inits, present)
                continue
            key = (recipe.chain.nodes[-1].output[0], None, False)
            if key not in made:
                source = self._const(recipe.init, inits, present) if recipe.init is not None else node.input[k]
                final = rename(self._own(recipe.chain.nodes[-1].output[0]))
                nodes.extend(self._copy(recipe.chain, source, final, inits, present, rename))
                made[key] = final
            reads[k] = made[key]
        return reads

    def _copy(
        self,
        chain: Chain,
        source: str,
        final: str,
        inits: List[TensorProto],
        present: Set[str],
        rename: Callable[[str], str],
    ) -> List[onnx.NodeProto]:
        """The chain's nodes reading ``source`` (the first node's data input; a stored weight's DQ reads its own
        values) and writing ``final``, their constants added to ``inits`` once."""
        copies: List[onnx.NodeProto] = []
        previous = source
        for i, node in enumerate(chain.nodes):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = rename(self._own(node.name or f"{node.op_type}_{final}"))
            for j, name in enumerate(copy.input):
                if j == 0 and (chain.source is not None or i > 0):
                    copy.input[j] = previous
                elif name:
                    copy.input[j] = self._const(self.given.consts[name], inits, present)
            last = i == len(chain.nodes) - 1
            copy.output[0] = final if last else rename(self._own(node.output[0]))
            previous = copy.output[0]
            copies.append(copy)
        return copies

    def _const(self, tensor: TensorProto, inits: List[TensorProto], present: Set[str]) -> str:
        """The candidate's name of a constant of the quantized model, added to ``inits`` once."""
        name = self._own(tensor.name)
        if name not in present:
            made = TensorProto()
            made.CopyFrom(tensor)
            made.name = name
            inits.append(made)
            present.add(name)
        return name


def check_rebuilt(
    quantizer: GivenQuantizer, quantized: onnx.ModelProto, feeds: Dict[str, np.ndarray], option: str = "quantized_model"
) -> None:
    """The candidate keeping nothing computes what the quantized model does, bit for bit on ONNX Runtime's CPU
    provider with its optimizations off (so every Q/DQ runs as written), on ``feeds``.

    Raises:
        ConfigError: it does not: the quantized model holds more than Q/DQ around ``model=``'s nodes.
    """
    from runner.graph.activations import run_tensors

    rebuilt = quantizer.convert([])
    names = [o.name for o in quantized.graph.output]
    try:
        want = run_tensors(quantized, feeds, names)
        got = run_tensors(rebuilt, feeds, [o.name for o in rebuilt.graph.output])
    except (ModelError, RuntimeError) as e:  # onnxruntime's session raises its own Fail, a RuntimeError
        raise ConfigError(f"{option}= cannot be run on ONNX Runtime's CPU provider ({first_line(e)})") from None
    for name, out in zip(names, [o.name for o in rebuilt.graph.output]):
        a, b = np.asarray(want[name]), np.asarray(got[out])
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            raise ConfigError(
                f"{option}= does not compute what model= with its Q/DQ computes (output {name} differs): it changes "
                "more than Q/DQ and initializers; give the QDQ model as the quantizer wrote it"
            )
