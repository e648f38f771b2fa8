"""``mode=precision``: the fewest nodes to keep out of a low precision, as one package.

- ``strategy.py``: ``PrecisionStrategy``, the mode's strategy, built from one frozen record (``setup.py``);
- ``setup.py``: the record from the mode's keys (``PrecisionSetup``): options checked, the search space made;
- ``space.py``: what the search runs over: the prepared model, the nodes it may keep, the candidate maker
  (``runner.lowp.makers``), the rankings (the second one, by output error, in ``output_order.py``);
- ``stages.py``: what a stage's candidates hold (one stage, or int8 with the rest in fp16: ``float_rest.py``);
- ``gates.py``: the checks besides the search's candidates; ``search.py``: which search the keys choose;
- the searches over a ranking: ``group_search.py`` (the minimal marker's), ``tied_search.py`` (repeated blocks),
  ``exchange.py`` (trades after a 1-minimal answer), ``deferred_search.py`` (a search made once its ranking is);
- ``facts.py`` and ``tradeoff.py``: what the run adds to ``summary.json``.

Nothing is imported here: start-up reads the mode's keys from ``strategies.mode_keys`` without this package.
"""
