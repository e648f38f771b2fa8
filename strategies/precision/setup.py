"""How ``mode=precision`` is set up from its keys: the options checked, int8's calibration, the search
space, its candidate maker and ranking, the stages (int8 with the rest in fp16 runs two), and the model's repeated
blocks: the ``PrecisionSetup`` that ``PrecisionStrategy.create`` hands the strategy."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import onnx

from runner.checkers.base import Checker
from runner.config import Untie, answer_options, save_options
from runner.context import RunContext
from runner.errors import ConfigError
from runner.graph.blocks import Blocks, find_blocks
from runner.graph.scope import Scope
from runner.graph.weight_file import weight_bytes
from runner.lowp.fp8 import check_fp8
from runner.lowp.given_match import given_precision, load_given
from runner.lowp.makers import CandidateMaker
from runner.lowp.precisions import FLOAT8, LowPrecision, any_low_precision, is_quantized
from runner.lowp.quant_options import QuantOptions
from strategies.boundary import BoundaryMarker, searches_sets
from strategies.budget import Budget
from strategies.mode_keys import PrecisionKeys
from strategies.precision.output_order import OutputErrorOrder
from strategies.precision.search import exchange_budget
from strategies.precision.space import float_rest, search_space
from strategies.precision.stages import SingleStage, Stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrecisionSetup:
    """What ``precision_setup`` hands ``PrecisionStrategy``.

    Attributes:
        model: the prepared fp32 model, nodes named, Constant nodes as initializers.
        layers: indices of the nodes that can be kept, in topological order.
        marker: ``marker(count)`` returns a boundary marker (bisect, linear or minimal).
        direction: "forward", "reverse" or "ranked" (prefix markers only).
        low: the low precision.
        output: where the final mixed-precision model is written.
        ranking: the nodes ranked by introduced error, for a set search or ``direction=ranked``, or a function
            computing it when the search first needs it (int8: after its fully quantized gate); None:
            topological prefixes.
        save_opts: ``external_data`` and ``threshold`` for ``save_model``.
        answer_opts: the answer's (``runner.config.answer_options``: also ``external_data_path``).
        weak_typing: candidates are TensorRT <= 10 engines built with layer precisions.
        maker: makes the candidates of the low precision's own search (``runner.lowp.makers``).
        stage: what the searches' unit sets mean (``strategies.precision.stages``: one stage, or int8 with the
            rest in fp16, ``strategies.precision.float_rest``).
        forced: indices of nodes outside the scope: float32 in every candidate.
        scoped: some float nodes are outside the search (``include_*``/``exclude_*``).
        original: the model as the user gave it: the all-fp32 gate checks it as it is (its golden values' own
            model), so that gate cannot fail for the tool's own reasons.
        reorder: ranks the nodes again for a set search that finds them many (``output_order.OutputErrorOrder``).
        blocks: the model's repeated blocks (``runner.graph.blocks``), or None: node by node.
        untie: how far a tied answer is searched block by block (``Untie``).
        exchange_checks: checks a minimal search may spend trading two kept nodes for one (0: none).
        budget: where the search stops short with the best answer checked so far, or None.
        run_dir: the run's directory (``tradeoff.png``), or None.
    """

    model: onnx.ModelProto
    layers: List[int]
    marker: Callable[[int], BoundaryMarker]
    direction: str
    low: LowPrecision
    output: Path
    ranking: Optional[List[int] | Callable[[], List[int]]]
    save_opts: Dict[str, Any]
    answer_opts: Dict[str, Any]
    weak_typing: bool
    maker: CandidateMaker
    stage: Stage
    forced: List[int]
    scoped: bool
    original: Optional[onnx.ModelProto]
    reorder: OutputErrorOrder
    blocks: Optional[Blocks]
    untie: Untie
    exchange_checks: int
    budget: Optional[Budget]
    run_dir: Optional[Path]
    model_name: str = ""


def precision_setup(
    ctx: RunContext,
    keys: PrecisionKeys,
    checker: Optional[Checker],
    marker: Optional[Callable[[int], BoundaryMarker]],
) -> PrecisionSetup:
    """What ``PrecisionStrategy`` runs on for a run: ``ctx.model`` prepared (nodes named, Constant nodes as
    initializers), its candidate maker, nodes ranked for a set search.

    Args:
        ctx: the run context (model; feeds and fp32 values for the ranking).
        keys: the mode's keys: int8's ``calibration`` is computed once here, on the samples of
            ``inputs=``/``data_loader=``; only nodes in the scope (``runner.graph.scope``) are
            searched, excluded ones stay float32.
        checker: the run's checker; when it judges on a device (CUDA EP, TensorRT) the ranking
            runs there too (``ranking_backend``).
        marker: the marker factory (``marker=``).

    Returns:
        The ``PrecisionSetup``.

    Raises:
        ModelError: bad model. ConfigError: unsupported precisions or options; int8 without
            input samples to calibrate on, or bad ones.
        MissingExtraError: ``weak_typing=true`` without TensorRT.
    """
    if marker is None:
        raise ConfigError("mode=precision needs a marker (marker=bisect, linear, minimal or auto)")
    precision, direction, weak_typing = keys.precision.value, keys.direction.value, keys.weak_typing
    if precision != "float32":
        raise ConfigError(
            f"precision={precision}: kept nodes stay in float32 (low_precision=int8's too); "
            "use precision=float32 with low_precision=float16, bfloat16 or int8"
        )
    given = load_given(keys.quantized_model) if keys.quantized_model else None
    low_precision = given_precision(given) if given is not None else any_low_precision(keys.low_precision)
    assert low_precision is not None  # the schema's default is float16
    if is_quantized(low_precision) and weak_typing:
        raise ConfigError(
            "weak_typing=true builds layer precisions into an engine; int8 candidates are QDQ models that "
            "TensorRT builds strongly typed: drop weak_typing"
        )
    if weak_typing:
        from runner.trt import load_tensorrt

        load_tensorrt("weak_typing=true")
    quant = QuantOptions.from_keys(keys) if is_quantized(low_precision) and given is None else None
    if quant is not None and low_precision is FLOAT8:
        check_fp8(quant)
    ranked = searches_sets(marker) or direction == "ranked"
    budget = keys.ranking_memory_mb
    if budget is not None and not float(budget) > 0:
        raise ConfigError(f"ranking_memory_mb={budget}; give a positive number of MiB, or null for no limit")
    ranking_budget = None if budget is None else int(float(budget) * 2**20)
    if checker is not None:  # before the ranking: a reference that is only noise is refused first
        checker.trust_reference(ctx)
    space = search_space(ctx, low_precision, Scope.from_keys(keys), quant, checker, ranked, ranking_budget, given)
    rest = float_rest(ctx, space, checker, ranking_budget) if quant is not None and quant.float16_rest else None
    blocks = find_blocks(space.model, space.layers) if keys.tie_blocks and searches_sets(marker) else None
    if blocks is not None:
        families = ", ".join(f"{name} x{len(found)}" for name, found in blocks.families.items())
        log.info(
            "The model repeats blocks (%s, found by %s): %d of %d searched nodes in %d tied positions, "
            "each decided once for every block first (tie_blocks=false: node by node)",
            families,
            blocks.how,
            len(blocks.tied_nodes & frozenset(space.layers)),
            len(space.layers),
            len(blocks.ties),
        )
    if rest is not None:
        stage: Stage = rest
    else:  # the maker's switchboard (one per maker, the second ranking's too); an engine built with layer
        # precisions runs no switched model
        board = None if weak_typing else space.reorder.switchboard
        stage = SingleStage(space.maker, space.model, space.layers, space.forced, board)
    return PrecisionSetup(
        model=space.model,
        layers=space.layers,
        marker=marker,
        direction=direction,
        low=low_precision,
        output=Path(keys.output or "mixed_precision.onnx"),
        ranking=space.ranking,
        save_opts=save_options(keys),
        answer_opts=answer_options(keys),
        weak_typing=weak_typing,
        maker=space.maker,
        stage=stage,
        forced=space.forced,
        scoped=space.scoped,
        original=ctx.model,
        reorder=space.reorder,
        blocks=blocks,
        untie=keys.untie,
        exchange_checks=exchange_budget(keys.exchange_checks, is_quantized(low_precision)),
        budget=Budget.from_keys(keys.budget, ctx.started, weight_bytes(ctx.model)),
        run_dir=ctx.run_dir,
        model_name=ctx.model_path.name if ctx.model_path is not None else "",
    )
