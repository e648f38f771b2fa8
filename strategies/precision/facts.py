"""What a precision search adds to ``summary.json`` beside its answer: the repeated blocks it searched
(``blocks``) and the trades after the 1-minimal answer (``exchange``), read from the search objects once the run is
done (what a stage adds: ``Stage.facts``)."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Optional

from runner.graph.blocks import Blocks
from strategies.precision.exchange import ExchangeSearch
from strategies.precision.tied_search import TiedSearch

Units = FrozenSet[int]


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
