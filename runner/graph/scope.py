"""Which nodes a search or a report covers: ``include_nodes``/``exclude_nodes`` (regular expressions
on node names, ``re.search``) and ``include_op_types``/``exclude_op_types``.

A node is in scope when it matches an include (or no include is given) and no exclude. What the
modes do with the others:

- ``mode=reduce``: the search stays inside the scope; nodes outside it stay in every candidate.
- ``mode=precision``: only nodes in scope are searched; an excluded node always stays in float32
  (ModelOpt AutoCast's ``nodes_to_exclude``/``op_types_to_exclude``), a node outside an include
  always takes the low precision.
- ``mode=layerwise``: only nodes in scope get rows.

A pattern that matches no node, or an op type the model does not hold, is an error: a typo must
not silently widen or narrow the search.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Hashable, Iterable, List, Mapping, Optional, Pattern, Sequence, Tuple, TypeVar

from runner.config import ScopeKeys
from runner.errors import ConfigError

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Scope:
    """The four scope options, compiled.

    Attributes:
        include_nodes, exclude_nodes: compiled regular expressions on node names.
        include_op_types, exclude_op_types: op type names.
    """

    include_nodes: Tuple[Pattern[str], ...] = ()
    exclude_nodes: Tuple[Pattern[str], ...] = ()
    include_op_types: Tuple[str, ...] = ()
    exclude_op_types: Tuple[str, ...] = ()
    given: bool = field(default=False, compare=False)

    @classmethod
    def from_options(
        cls,
        include_nodes: Optional[Sequence[str]] = None,
        exclude_nodes: Optional[Sequence[str]] = None,
        include_op_types: Optional[Sequence[str]] = None,
        exclude_op_types: Optional[Sequence[str]] = None,
    ) -> Scope:
        """Compile the options.

        Raises:
            ConfigError: a pattern that is not a valid regular expression.
        """

        def compiled(option: str, patterns: Optional[Sequence[str]]) -> Tuple[Pattern[str], ...]:
            out = []
            for p in patterns or ():
                try:
                    out.append(re.compile(str(p)))
                except re.error as e:
                    raise ConfigError(
                        f"{option}: {p!r} is not a regular expression ({e}); escape it, e.g. '\\\\.'"
                    ) from None
            return tuple(out)

        given = any((include_nodes, exclude_nodes, include_op_types, exclude_op_types))
        return cls(
            compiled("include_nodes", include_nodes),
            compiled("exclude_nodes", exclude_nodes),
            tuple(str(o) for o in include_op_types or ()),
            tuple(str(o) for o in exclude_op_types or ()),
            given,
        )

    @classmethod
    def from_keys(cls, keys: ScopeKeys) -> Scope:
        """``from_options`` of a mode's scope keys (``runner.config.ScopeKeys``).

        Raises:
            ConfigError: a pattern that is not a valid regular expression.
        """
        return cls.from_options(keys.include_nodes, keys.exclude_nodes, keys.include_op_types, keys.exclude_op_types)

    def included(self, name: str, op: str) -> bool:
        """Whether a node matches the includes (True when none is given)."""
        if not self.include_nodes and not self.include_op_types:
            return True
        return any(p.search(name) for p in self.include_nodes) or op in self.include_op_types

    def excluded(self, name: str, op: str) -> bool:
        """Whether a node matches an exclude."""
        return any(p.search(name) for p in self.exclude_nodes) or op in self.exclude_op_types

    def selects(self, name: str, op: str) -> bool:
        """Whether a node is in scope: included and not excluded."""
        return self.included(name, op) and not self.excluded(name, op)

    def check(self, nodes: Iterable[Tuple[str, str]], what: str = "the model") -> None:
        """Every pattern and op type must match a node of ``nodes`` (``(name, op type)`` pairs), and
        some node must stay in scope.

        Raises:
            ConfigError: naming the option and the pattern or op type that matches nothing.
        """
        pairs = list(nodes)
        ops = {op for _, op in pairs}
        for option, patterns in (("include_nodes", self.include_nodes), ("exclude_nodes", self.exclude_nodes)):
            for p in patterns:
                if not any(p.search(name) for name, _ in pairs):
                    raise ConfigError(f"{option}: {p.pattern!r} matches no node name of {what}; check the names")
        for option, types in (("include_op_types", self.include_op_types), ("exclude_op_types", self.exclude_op_types)):
            missing = sorted(set(types) - ops)
            if missing:
                raise ConfigError(f"{option}: {what} has no node of op type {missing}; it has {sorted(ops)}")
        if pairs and not any(self.selects(name, op) for name, op in pairs):
            raise ConfigError(f"the scope options leave no node of {what} in scope; loosen include_*/exclude_*")

    def split(self, groups: Mapping[K, Sequence[Tuple[str, str]]], what: str = "the model") -> Tuple[List[K], List[K]]:
        """Check the options against every node of ``groups`` (``check``), then split the groups:
        one is in scope when a node of it is, excluded when a node of it matches an exclude.

        Args:
            groups: per key (a node index, a unit of fused nodes), its nodes' ``(name, op type)``.
            what: the node set's name in errors.

        Returns:
            (the keys in scope, the keys excluded), each in the order of ``groups``.

        Raises:
            ConfigError: as ``check``.
        """
        self.check([pair for pairs in groups.values() for pair in pairs], what)
        selected = [k for k, pairs in groups.items() if any(self.selects(*p) for p in pairs)]
        excluded = [k for k, pairs in groups.items() if any(self.excluded(*p) for p in pairs)]
        return selected, excluded
