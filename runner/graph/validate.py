"""Is a model the tool made valid? ONNX's checker and strict type inference, with the culprit named.

Every candidate the tool builds (a converted, mixed-precision or reduced model) is validated
before it is checked: a model ONNX Runtime would refuse to load ("Type (tensor(float16)) of
output arg ... does not match expected type (tensor(float))") is the tool's defect, not a
verdict on the user's model. ONNX's shape inference in strict mode with type checks
(``check_type=True``) reports the same defects without building a session: a declared type that
differs from the inferred one, an input of a type an operator does not take, a node reading a
tensor nothing produces.

A model that already fails strict inference as the user gave it (custom ops, exporter
quirks) cannot hold its candidates to that standard: ``Validator`` then checks candidates with
``onnx.checker`` alone and says so once; a problem the model as given has too (an output
declared without a shape) is inherited, not the tool's defect.
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Dict, List, Optional, Tuple

import onnx

from runner.errors import InvalidCandidateError, ModelError
from runner.graph.stubs import is_stub, weightless

log = logging.getLogger(__name__)

_NODE = re.compile(r"\(op_type:(?P<op>[^,]*), node name: (?P<node>[^)]*)\)")
_TYPES = re.compile(r"\((?P<inferred>\d+)\) vs \((?P<declared>\d+)\)")


def _graph_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for the checks, built without copying its weights (``runner.graph.stubs``):
    a weight of ``STUB_BYTES`` or more, or stored outside it (in a file its path is relative to),
    becomes a graph input of its type and shape, which is all type inference reads of it."""
    bare, _ = weightless(model)
    g = bare.graph
    inputs = {i.name for i in g.input}
    kept = []
    for init in g.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL or is_stub(init):
            if init.name not in inputs:  # IR < 4 models list their weights as inputs too
                g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            kept.append(init)
    del g.initializer[:]
    g.initializer.extend(kept)
    return bare


def strict_problem(model: onnx.ModelProto) -> Optional[str]:
    """The first line of what ``onnx.checker`` or strict type inference finds wrong with ``model``,
    or None when it is valid.

    Types, not shapes, are held to strict inference: the declared shapes are set aside first,
    since onnx's shape inference disagrees with concrete shapes that ONNX Runtime measured
    (data propagation through a ``Reshape`` to ``[-1, ...]`` infers a dimension of -1). Weights
    are checked by type and shape, not by their values (``_graph_only``).

    Args:
        model: the model (not modified).

    Returns:
        The problem as ONNX words it, or None.
    """
    return _strict(model, types=False)[0]


def _strict(model: onnx.ModelProto, types: bool) -> Tuple[Optional[str], Dict[str, int]]:
    """``strict_problem``'s problem, and with ``types`` when there is none the element type of every
    tensor of the top-level graph as strict inference gives it (``{name: TensorProto.DataType}``;
    else empty)."""
    bare = _graph_only(model)
    g = bare.graph
    try:
        onnx.checker.check_model(bare)
        for vi in g.value_info:
            vi.type.tensor_type.ClearField("shape")
        for vi in list(g.input) + list(g.output):  # the rank stays, the dimensions go
            for dim in vi.type.tensor_type.shape.dim:
                dim.Clear()
        inferred = onnx.shape_inference.infer_shapes(bare, check_type=True, strict_mode=True)
    except Exception as e:  # ValidationError, InferenceError, and the C++ layer's RuntimeErrors
        return " ".join(str(e).split()), {}
    return None, _declared_types(inferred) if types else {}


def _checker_problem(model: onnx.ModelProto) -> Optional[str]:
    """What ``onnx.checker`` alone finds wrong with ``model`` (one line), or None."""
    try:
        onnx.checker.check_model(_graph_only(model))
    except Exception as e:
        return " ".join(str(e).split())
    return None


def _declared_types(model: onnx.ModelProto) -> Dict[str, int]:
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.output) + list(g.value_info)}
    types.update({i.name: i.data_type for i in g.initializer})
    return types


def culprit(model: onnx.ModelProto, problem: str) -> str:
    """The node and tensor a validation ``problem`` is about, as words: ``node N (Op), tensor T``.

    ONNX names the node (``op_type:Gather, node name: /m/pooler/Gather``) and, for a type
    mismatch, the two types (``(1) vs (10)``: inferred float, declared float16); the tensor is
    the node's output declared with the type ONNX did not infer (else its first output).
    """
    found = _NODE.search(problem)
    if found is None:
        return "node unknown"
    name, op = found.group("node"), found.group("op")
    node = next((n for n in model.graph.node if n.name == name), None)
    if node is None:
        return f"node {name} ({op})"
    outputs: List[str] = [o for o in node.output if o]
    tensor = outputs[0] if outputs else ""
    types = _TYPES.search(problem[found.end() :])
    if types is not None:
        declared = _declared_types(model)
        want = int(types.group("declared"))
        tensor = next((o for o in outputs if declared.get(o) == want), tensor)
    return f"node {name} ({op}), tensor {tensor}" if tensor else f"node {name} ({op})"


class Validator:
    """Validates the models a run builds from one source model.

    Args:
        source: the model as the user gave it (or as prepared for the mode); validated once here.
        what: how the source is named in messages, e.g. "the model".
        warn: log when the source itself fails strict inference.

    Attributes:
        strict: whether candidates are held to strict type inference (the source passes it).
    """

    #: keep the source's inferred types (``types``): only a validator that reads them pays for them
    keeps_types = False

    def __init__(self, source: onnx.ModelProto, what: str = "the model", warn: bool = True):
        problem, types = _strict(source, self.keeps_types)
        self.strict = problem is None
        #: every top-level tensor's element type as strict inference gives it (empty unless ``strict`` and
        #: ``keeps_types``)
        self.types: Dict[str, int] = types
        #: what onnx.checker finds wrong with the source itself: a candidate with the same problem inherited it
        self.inherited = _checker_problem(source) if problem is not None else None
        if problem is not None and warn:
            log.warning(
                "%s itself fails strict ONNX type inference (%s); candidates are validated with onnx.checker only",
                what[:1].upper() + what[1:],
                problem[:200],
            )

    def check(self, model: onnx.ModelProto, step: str) -> onnx.ModelProto:
        """Return ``model`` when it is valid.

        Args:
            model: a model the tool built.
            step: what built it, for the message, e.g. "the float16 conversion keeping 3 nodes in float32".

        Returns:
            ``model`` itself.

        Raises:
            InvalidCandidateError: the model is invalid: names the node, the tensor and ``step``.
        """
        problem = strict_problem(model) if self.strict else _checker_problem(model)
        if problem is not None and problem != self.inherited:
            raise InvalidCandidateError(
                f"{step} made an invalid model at {culprit(model, problem)}: {problem[:300]}; this is a defect of "
                "the tool, not of your model: please report it with the model (no verdict was recorded for it)",
                model,
            )
        return model


class SubgraphValidator(Validator):
    """Validates subgraphs of one source model (``mode=reduce``'s candidates) by what extracting
    them changes: their boundary.

    A subgraph keeps the source's nodes as they are; what extraction makes anew is its graph inputs
    and outputs (declared from measured or inferred dtypes), initializers made of Constant nodes or
    of folded values, and the node list. Strict type inference is local to each node given its
    inputs' types, so a subgraph of a source that passes it passes it too when ``onnx.checker``
    accepts its structure (every input read is produced before, in topological order, and in
    subgraphs' outer scopes) and every declared tensor has the type the source's inference gives
    it. That check costs a dictionary look-up per boundary tensor where strict inference costs a
    pass over the whole subgraph (0.3 s at 60,000 nodes). The first model checked, and any that
    declares a tensor the source's inference did not type, is held to full strict inference.

    Args:
        as ``Validator``'s.
    """

    keeps_types = True

    def __init__(self, source: onnx.ModelProto, what: str = "the model", warn: bool = True):
        super().__init__(source, what, warn)
        self._full_once = True

    def check(self, model: onnx.ModelProto, step: str) -> onnx.ModelProto:
        """As ``Validator.check``, by the subgraph's boundary once the source passes strict inference.

        Raises:
            InvalidCandidateError: the model is invalid (the tool's defect): names the tensor or node and ``step``.
        """
        if not self.strict or self._full_once:
            self._full_once = False
            return super().check(model, step)
        problem = _checker_problem(model)
        where = culprit(model, problem) if problem is not None else ""
        if problem is None:
            g = model.graph
            declared = [(v.name, v.type.tensor_type.elem_type) for v in list(g.input) + list(g.output)]
            declared += [(i.name, i.data_type) for i in g.initializer]
            if any(name not in self.types for name, _ in declared):
                return super().check(model, step)  # a tensor the source's inference did not type
            wrong = next(((name, got) for name, got in declared if got != self.types[name]), None)
            if wrong is not None:
                where = f"tensor {wrong[0]}"
                problem = (
                    f"declared {_type_name(wrong[1])} where the whole model has {_type_name(self.types[wrong[0]])}"
                )
        if problem is not None:
            raise InvalidCandidateError(
                f"{step} made an invalid model at {where}: {problem[:300]}; this is a defect of "
                "the tool, not of your model: please report it with the model (no verdict was recorded for it)",
                model,
            )
        return model


def _type_name(data_type: int) -> str:
    return onnx.TensorProto.DataType.Name(data_type).lower()


def converted(source: onnx.ModelProto, convert: Callable[[], onnx.ModelProto], step: str) -> onnx.ModelProto:
    """``convert()``, a conversion of ``source``, validated as ``Validator(source).check`` does.

    Args:
        source: the model converted (not modified).
        convert: makes the converted model; may raise ``ModelError``.
        step: what converts, for the message.

    Raises:
        InvalidCandidateError: the conversion failed or made an invalid model (the tool's defect).
    """
    try:
        model = convert()
    except ModelError as e:
        raise InvalidCandidateError(
            f"{step} failed: {e}; this is a defect of the tool, not of your model: please report it with the model"
        ) from None
    return Validator(source, warn=False).check(model, step)
