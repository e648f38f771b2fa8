"""The search a precision run drives: over nodes ranked by the error each introduces (a prefix search, or
for the minimal marker a set search, tied over repeated blocks, traded smaller by exchange), and the
exchange budget (the fp16 stage's search of an int8 run with the rest in fp16: ``FloatRest.first_search``).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from runner.errors import ConfigError
from runner.graph.blocks import Blocks
from strategies.boundary import BoundaryMarker, searches_sets
from strategies.onnx_search import Search
from strategies.precision.exchange import ExchangeSearch
from strategies.precision.group_search import GroupSearch
from strategies.precision.tied_search import TiedSearch, Untie
from strategies.prefix_search import PrefixSearch


def ranked_search(
    order: List[int],
    marker: Callable[[int], BoundaryMarker],
    reorder: Optional[Callable[[List[Any]], List[Any]]] = None,
    blocks: Optional[Blocks] = None,
    untie: Untie = Untie.auto,
    exchange_checks: int = 0,
) -> Search:
    """The search over ``order`` (nodes ranked by the error each introduces): for the minimal marker a
    set search, over the repeated ``blocks``' ties and the other nodes where the model repeats a block
    (``strategies.precision.tied_search``), else over the nodes (``strategies.precision.group_search``), ranking them
    again with ``reorder`` when its gallop finds them many, its 1-minimal answer then traded smaller
    within ``exchange_checks`` checks (``strategies.precision.exchange``); else a prefix search."""
    if not searches_sets(marker):
        return PrefixSearch(order, marker)
    if blocks is not None:
        ties = [(tie.label, tie.nodes) for tie in blocks.ties]
        return TiedSearch(order, ties, marker, reorder, untie)
    found = GroupSearch(order, marker, reorder)
    return ExchangeSearch(found, lambda: found.order, exchange_checks) if exchange_checks > 0 else found


#: ``exchange_checks`` of an int8 run when the key is unset (``strategies.precision.exchange``)
INT8_EXCHANGE_CHECKS = 16


def exchange_budget(value: Any, quantized: bool) -> int:
    """``exchange_checks=``, validated; None: ``INT8_EXCHANGE_CHECKS`` for int8, 0 for others.

    Args:
        value: the key as given (None when unset). quantized: the run searches int8.

    Returns:
        The checks the exchange may spend after the 1-minimal answer (0: no exchange).

    Raises:
        ConfigError: not a whole number >= 0.
    """
    if value is None:
        return INT8_EXCHANGE_CHECKS if quantized else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"exchange_checks={value!r}: give how many checks may trade two kept nodes for one after the "
            "1-minimal answer (a whole number, 0 for none)"
        )
    return value
