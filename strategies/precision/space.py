"""What a ``mode=precision`` search runs over: the prepared model, the nodes it may keep, the nodes the
scope keeps whatever it finds, the candidate maker (``runner.lowp.makers``), and the ranking of the searchable
nodes.

fp16 and bf16 prepare the run's model (nodes named, Constant nodes as initializers) and may keep any
float node; int8 calibrates once on the run's samples and may keep the nodes its full quantization
quantizes. The ranking (``runner.layerwise.ranking``: the error each node introduces, run on the
checker's backend; by magnitude where that cannot run) is computed here for a ranked search, or
deferred for int8, whose fully quantized model is checked first.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable, List, Optional

import onnx

from runner.checkers.base import Checker
from runner.context import RunContext
from runner.errors import ConfigError, ModelError
from runner.files.rankings import key_of, names_digest
from runner.graph.load import fingerprint
from runner.graph.qdq import quantized_nodes
from runner.graph.scope import Scope
from runner.graph.weight_file import weight_bytes
from runner.layerwise.ranking import introduced_ranking, ranking_backend, sensitivity_ranking
from runner.lowp.calibration import calibrate
from runner.lowp.convert import float_nodes, prepare
from runner.lowp.fp8 import FP8_OPSET
from runner.lowp.given_match import given_precision, opset_of
from runner.lowp.given_qdq import GivenQuantizer, check_rebuilt
from runner.lowp.makers import CandidateMaker, PlacedMaker, make_maker
from runner.lowp.mixed_qdq import MIXED_OPSET
from runner.lowp.precisions import FLOAT8, FLOAT16, INT8, LowPrecision
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import INT8_OPSET, prepare_int8
from runner.terminal.stretch import stretch
from strategies.precision.float_rest import FloatRest
from strategies.precision.output_order import OutputErrorOrder, backend_key

log = logging.getLogger(__name__)


@dataclass
class SearchSpace:
    """What ``search_space`` returns.

    Attributes:
        model: the prepared fp32 model (the run's own, prepared in place: no second copy).
        layers: indices of the nodes the search may keep, in topological order.
        forced: indices of nodes outside the scope: float32 in every candidate.
        scoped: a scope was given (some float nodes are outside the search).
        maker: makes the candidates (``runner.lowp.makers``): casts for fp16 and bf16, Q/DQ from the run's
            calibration for int8 and fp8, or from the given quantized model.
        ranking: the searchable nodes ranked by introduced error, a function computing it when the
            search first needs it (int8), or None for topological prefixes.
        reorder: ranks the nodes again by the error each makes at the outputs alone in the low
            precision (``runner.layerwise.output_ranking``), for a set search that finds them many
            (``strategies.precision.group_search.REORDER_FROM``).
    """

    model: onnx.ModelProto
    layers: List[int]
    forced: List[int]
    scoped: bool
    maker: CandidateMaker
    ranking: Optional[List[int] | Callable[[], List[int]]]
    reorder: OutputErrorOrder


def search_space(
    ctx: RunContext,
    low: LowPrecision,
    scope: Scope,
    quant: Optional[QuantOptions],
    checker: Optional[Checker],
    ranked: bool,
    ranking_budget: Optional[int] = None,
    given: Optional[onnx.ModelProto] = None,
) -> SearchSpace:
    """Prepare ``ctx.model`` for a search in ``low`` and rank its searchable nodes when ``ranked``.

    Args:
        ctx: the run context (model; samples and fp32 summaries for the ranking; ``lanes`` to spread it).
        low: the low precision (int8: a quantized one).
        scope: the mode's scope keys (``runner.graph.scope``).
        quant: int8's calibration and quantization options; None for fp16 and bf16.
        checker: the run's checker; when it judges on a device the ranking runs there (``ranking_backend``).
        ranked: a set search or ``direction=ranked``: the search needs the ranking.
        ranking_budget: bytes of tensor values the ranking holds at once (``ranking_memory_mb``;
            past it, nodes are compared in chunks), or None for no limit.
        given: the quantized model another tool made (``quantized_model=``): its Q/DQ are the candidates'
            (``runner.lowp.given_qdq``), no calibration; None: the run places and calibrates its own.

    Raises:
        ConfigError: int8 without input samples, or with nothing to quantize; bad samples.
        ModelError: the opset cannot be raised, or ONNX Runtime cannot calibrate or quantize.
    """
    if given is not None:
        maker, layers = _given(ctx, given)
    elif quant is not None:
        maker, layers = _int8(ctx, quant, low)
    else:
        model = prepare(ctx.model, low, in_place=True)  # the run's model, prepared: one copy
        maker, layers = make_maker(model, low), float_nodes(model)
    model = maker.model
    forced: List[int] = []
    if scope.given:
        nodes = {i: [(model.graph.node[i].name, model.graph.node[i].op_type)] for i in layers}
        searched, forced = scope.split(nodes, f"the model's {len(layers)} float nodes")
        log.info(
            "Scope: %d of %d float nodes searched, %d kept in float32 whatever the search finds",
            len(searched),
            len(layers),
            len(forced),
        )
        layers = searched

    def rank() -> List[int]:
        size = weight_bytes(model)
        target = None  # the whole model in the low precision
        try:
            with stretch(f"Converting the weights to {low}", size):
                target = maker.candidate([])
        except ModelError:
            if low.quantized:
                raise
            # a conversion that fails: the ranking says why and ranks by magnitude
        with stretch(f"Ranking {len(layers)} nodes by the error each introduces in {low}", size):
            return introduced_order(ctx, model, layers, low, target, checker, ranking_budget)

    ranking: Optional[List[int] | Callable[[], List[int]]] = None
    if ranked:
        ranking = rank if low.quantized else rank()  # int8 ranks once its full-quantization gate fails
    everything = frozenset(layers) | frozenset(forced)
    switchboard = maker.switchboard(f"switchboard:{fingerprint(model)}:{low}")
    reorder = OutputErrorOrder(ctx, model, everything, maker, checker, switchboard)
    return SearchSpace(model, layers, forced, scope.given, maker, ranking, reorder)


def introduced_order(
    ctx: RunContext,
    model: onnx.ModelProto,
    layers: List[int],
    low: LowPrecision,
    target: Optional[onnx.ModelProto],
    checker: Optional[Checker],
    ranking_budget: Optional[int],
) -> List[int]:
    """``layers`` ranked by the error each introduces in ``low`` (``runner.layerwise.ranking``), on the
    checker's device where it judges on one; by magnitude where the model cannot be converted or run.

    Args:
        ctx: the run context (samples, fp32 summaries, lanes).
        model: the prepared fp32 model.
        layers: indices of the nodes to rank.
        low: the low precision.
        target: the whole model in ``low`` (int8: the fully quantized QDQ model); None: converted here.
        checker: the run's checker (``ranking_backend``).
        ranking_budget: bytes of tensor values held at once, or None for no limit.
    """
    names = [model.graph.node[i].name for i in layers]
    key = key_of(
        ctx.identity,
        backend=backend_key(checker),
        low=low.name,
        nodes=names_digest(names),
        target=fingerprint(target) if target is not None else None,
    )
    stored = ctx.rankings.get("introduced", key)
    if stored is not None and sorted(stored) == sorted(names):
        index = {model.graph.node[i].name: i for i in layers}
        return [index[n] for n in stored]
    # chunks sized by each tensor's bytes from shape inference alone: no extra fp32 run of the model
    sizes = ctx.tensor_sizes(model, measure=False) if ranking_budget is not None else None
    backend = ranking_backend(checker)
    order = introduced_ranking(
        model, layers, ctx.ranking_samples, low, backend, target, ctx.lanes, ranking_budget, sizes
    )
    if order is None:
        order = sensitivity_ranking(model, layers, ctx.summaries)
    else:
        ctx.rankings.put("introduced", key, [model.graph.node[i].name for i in order])
    log.info(
        "Nodes ranked by the error each introduces in %s; first: %s",
        low,
        ", ".join(model.graph.node[i].name for i in order[:5]),
    )
    return order


def float_rest(
    ctx: RunContext, space: SearchSpace, checker: Optional[Checker], ranking_budget: Optional[int]
) -> FloatRest:
    """The stages of an int8 search with the rest in fp16 (``quantization.float_precision=float16``,
    ``strategies.precision.float_rest``): the fp16 stage over every float node of ``space.model`` outside the
    scope's forced ones, ranked by the error each introduces in fp16 when the stage first needs it.

    Raises:
        ConfigError: the space's candidates are no Q/DQ model (``CandidateMaker.with_rest``).
        ModelError: shape inference fails on the model.
    """
    model, forced = space.model, frozenset(space.forced)
    float_layers = [i for i in float_nodes(model) if i not in forced]

    def rank() -> List[int]:
        target = None
        with contextlib.suppress(ModelError):  # the ranking then says why and ranks by magnitude
            target = rest.cast().candidate([])
        return introduced_order(ctx, model, float_layers, FLOAT16, target, checker, ranking_budget)

    rest = FloatRest(space.maker.with_rest(FLOAT16), model, space.layers, float_layers, forced, rank)
    return rest


def _given(ctx: RunContext, given: onnx.ModelProto) -> tuple[CandidateMaker, List[int]]:
    """The maker of a quantized model another tool made: ``ctx.model`` prepared at its opset and matched to
    it node by node (``GivenQuantizer``), checked to rebuild it bit for bit on the first sample; the nodes it
    quantizes.

    Raises:
        ConfigError: it is no quantized version of ``model=`` (``runner.lowp.given_match.read_given``), or
            rebuilt it computes something else.
        ModelError: the opset cannot be raised.
    """
    # at the given model's own opset: its Q/DQ are valid there, and a raised model= gains nodes it lacks
    opset = opset_of(given)
    model = prepare_int8(ctx.model, in_place=True, opset=opset, least=opset)
    quantizer = GivenQuantizer(model, given)
    check_rebuilt(quantizer, given, ctx.feeds)
    units = set(quantizer.given.units)
    layers = [i for i, n in enumerate(model.graph.node) if n.name in units]
    log.info(
        "quantized_model=: %d of %d nodes read its Q/DQ (%s) and can be taken out of it",
        len(layers),
        len(model.graph.node),
        given_precision(given),
    )
    return PlacedMaker(quantizer, given_precision(given)), layers


def _int8(ctx: RunContext, options: QuantOptions, low: LowPrecision = INT8) -> tuple[CandidateMaker, List[int]]:
    """Calibrate once on the run's samples; the maker of the prepared model's Q/DQ candidates and the indices of
    the nodes the full quantization quantizes (the nodes that can be kept).

    Raises:
        ConfigError: no ``inputs=``/``data_loader=`` (generated noise calibrates nothing real),
            bad samples, or no node to quantize.
        ModelError: the opset cannot be raised, or ONNX Runtime cannot calibrate or quantize.
    """
    if not ctx.inputs and not ctx.data_loader:
        raise ConfigError(
            f"low_precision={low} calibrates activation ranges on real input: give inputs=FILE.json "
            "(polygraphy run --save-inputs, several samples) or data_loader=module.function"
        )
    opset = FP8_OPSET if low is FLOAT8 else MIXED_OPSET if options.float16_rest else INT8_OPSET
    model = prepare_int8(ctx.model, in_place=True, opset=opset)
    calibration = calibrate(model, ctx.samples, options)
    maker = make_maker(model, low, calibration, options)
    quantized = quantized_nodes(maker.candidate([]))
    layers = [i for i, n in enumerate(model.graph.node) if n.name in quantized]
    if not layers:
        raise ConfigError(
            f"{low} quantization quantizes no node of this model ({maker.none_quantized()}); precision marking "
            "does not apply"
        )
    log.info("%d of %d nodes are quantized to %s and can be kept float", len(layers), len(model.graph.node), low)
    return maker, layers
