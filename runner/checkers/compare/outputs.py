"""Which tensors the compare checker compares: ``checker.outputs`` (and the detection tensors) that a
model computes, else its graph outputs but ``checker.exclude_outputs``; and the options that name no
tensor of the model or leave nothing to compare, refused before the first check."""

from __future__ import annotations

from typing import List, Sequence, Set

import onnx

from runner.checkers.compare.tolerance import Tolerances, unknown_names
from runner.errors import ConfigError


def compared(model: onnx.ModelProto, named: Sequence[str], excluded: Set[str]) -> List[str]:
    """The tensors compared for ``model``.

    Args:
        model: the model a check runs.
        named: ``checker.outputs`` and the detection tensors, in order (empty: the graph outputs).
        excluded: ``checker.exclude_outputs``.

    Returns:
        The named tensors ``model`` computes (or holds as graph outputs), once each, in order; without
        names, its graph outputs but the excluded ones.
    """
    if not named:
        return [o.name for o in model.graph.output if o.name not in excluded]
    computed = {o for n in model.graph.node for o in n.output} | {o.name for o in model.graph.output}
    return [n for n in dict.fromkeys(named) if n in computed and n not in excluded]


def check_compared(model: onnx.ModelProto, named: Sequence[str], excluded: Set[str]) -> None:
    """Refuse options that leave nothing to compare on the model as given.

    Args:
        model: the model as given. named, excluded: as for ``compared``.

    Raises:
        ConfigError: a tensor both named and excluded; a named tensor that is a graph input (fed,
            never computed); every graph output excluded.
    """
    both = sorted(set(named) & excluded)
    if both:
        raise ConfigError(
            f"checker.exclude_outputs leaves out {both}, which checker.outputs/detections name to compare; "
            "name each tensor in one of them"
        )
    fed = sorted(set(named) & {i.name for i in model.graph.input} - {o for n in model.graph.node for o in n.output})
    if fed:
        raise ConfigError(
            f"checker.outputs/detections name graph inputs {fed}: they are fed, never computed, so comparing "
            "them compares nothing; name tensors that nodes compute"
        )
    if not compared(model, named, excluded):
        raise ConfigError(
            f"checker.exclude_outputs={sorted(excluded)} leaves none of the graph outputs "
            f"{[o.name for o in model.graph.output]} to compare; exclude fewer, or name tensors in checker.outputs"
        )


def check_names(model: onnx.ModelProto, named: Sequence[str], rule: Tolerances) -> None:
    """Refuse tensor names the model does not have.

    Args:
        model: the model as given.
        named: ``checker.outputs``, ``checker.exclude_outputs`` and the detection tensors.
        rule: the tolerance rule, whose per-tensor atol/rtol name tensors too.

    Raises:
        ConfigError: a name in ``named`` or in the rule that is neither a node output nor a graph input.
    """
    tensors = [o for n in model.graph.node for o in n.output] + [t.name for t in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    missing = sorted(set(named) - set(tensors))
    if missing:
        raise ConfigError(
            f"checker.outputs/exclude_outputs/detections name {missing}, which are no tensors of the model "
            f"(its outputs: {outputs}); name node outputs of the model"
        )
    unknown = unknown_names(rule, tensors)
    if unknown:
        raise ConfigError(
            f"checker.atol/rtol name {unknown}, which no tensor of the model is (its outputs: {outputs}); "
            "fix the names (quote names such as onnx::Conv_5 in pairs: 'checker.atol=[[\"onnx::Conv_5\",0.1]]')"
        )
