"""DeferredSearch: the search (and the ranking it is built from) is made only when a round needs it."""

from __future__ import annotations

from strategies.minimal import MinimalMarker
from strategies.precision.deferred_search import DeferredSearch
from strategies.precision.search import ranked_search


def test_the_state_a_check_records_does_not_build_the_search():
    built = []
    marker = MinimalMarker

    def build():
        built.append(True)
        return ranked_search([2, 0, 1], marker)

    deferred = DeferredSearch(build, ranked_search([0, 1, 2], marker))
    # what each check's iteration record, the progress bar and the gates read
    assert (deferred.rounds, list(deferred.required), deferred.remaining()) == (0, [], 3)
    assert built == []
    first = deferred.propose(1)  # the search itself: built, from the ranking
    assert built == [True] and first
    assert first == [frozenset({2})]  # the ranked order's first node, not the stand-in's
