"""What a precision search adds to ``summary.json`` beside its answer: the repeated blocks it searched
(``blocks``), the trades after the 1-minimal answer (``exchange``), and with the rest in fp16 which
nodes run in fp16 and fp32. Read from the search objects once the run is done."""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional

from runner.graph.blocks import Blocks
from strategies.precision.exchange import ExchangeSearch
from strategies.precision.float_rest import FloatRest
from strategies.precision.tied_search import TiedSearch

Units = FrozenSet[int]


def rest_facts(
    rest: Optional[FloatRest],
    final: Optional[Units],
    forced: Units,
    describe: Callable[[Iterable[int]], List[Dict[str, str]]],
) -> Dict[str, Any]:
    """With the rest in fp16 (``strategies.precision.float_rest``): ``float_precision``, ``fp16_nodes`` (kept out of
    int8, in fp16), ``fp32_nodes`` (in float32: shown needed by the search, or outside the scope) and
    ``fp32_always`` (op types the fp16 converter never converts); empty otherwise.

    Args:
        rest: the run's stages, or None.
        final: the answer's units.
        forced: nodes outside the scope (fp32 in every candidate).
        describe: names and op types of node indices (``PrecisionStrategy.describe``).
    """
    if rest is None or final is None:
        return {}
    out, fp32 = rest.split(final)
    fp32 = fp32 | forced
    return {
        "float_precision": "float16",
        "fp16_nodes": describe(out - fp32),
        "fp32_nodes": describe(fp32),
        "fp32_always": describe(rest.blocked() - fp32),
    }


def exchange_facts(found: Any) -> Dict[str, Any]:
    """``{"exchange": {"budget", "checks", "trades", "from"}}`` when the search traded its 1-minimal answer
    smaller (``strategies.precision.exchange``): the checks spent, the trades made, the 1-minimal answer's size."""
    if not isinstance(found, ExchangeSearch) or found.started is None:
        return {}
    return {"exchange": {"budget": found.budget, "checks": found.spent, "trades": found.trades, "from": found.started}}


def tied_facts(blocks: Optional[Blocks], found: Any) -> Dict[str, Any]:
    """``{"blocks": ...}`` for a search over repeated blocks (``runner.graph.blocks``): how they were found,
    the units the tied phase searched, the level the answer is 1-minimal at (``minimal_at``), and each kept
    position with the blocks that keep it (``kept_positions``: ``unit`` true where those nodes are kept as
    one unit, false where each was shown needed); empty without blocks.

    Args:
        blocks: the model's repeated blocks, or None.
        found: the search itself (a ``TiedSearch`` when it searched over the blocks).
    """
    if blocks is None:
        return {}
    if not isinstance(found, TiedSearch):
        return {"blocks": blocks.summary()}
    block_of = {i: block for tie in blocks.ties for i, block in zip(tie.nodes, tie.blocks)}
    kept = [
        {"position": fact["position"], "blocks": [block_of[i] for i in fact["nodes"]], "unit": fact["unit"]}
        for fact in found.facts()
    ]
    return {
        "blocks": {
            **blocks.summary(),
            "units": found.units,
            "untie": found.untie.value,
            "minimal_at": found.level,
            "kept_positions": kept,
        }
    }
