"""Names under which a reduce candidate outputs a tensor that a ``polygraphy run --load-outputs`` check skips.

A candidate outputs the golden tensors it computes so that ONNX Runtime fuses nothing across them, as in the
run that recorded them (``runner.checkers.polygraphy_check``). Under their own names, ``polygraphy run``
compares each of them, about 8 ms an output on the bundled classifier: 130 outputs make a 0.5 s check take
1.3 s. Polygraphy's own candidates output their boundary only, and that is what its check compares.

Polygraphy's comparator (``polygraphy.comparator.compare.default_find_output_func``) matches each output of
the run to a loaded one with ``polygraphy.util.find_str_in_iterable``: the same name, else the first loaded
name that contains it or that it contains (case-insensitive), else the loaded output at its index; and it
skips an output whose match is itself an exact output of the run. So an extra output named
``<a compared output B><mark characters>``, with mark characters that no loaded name holds, matches the first
loaded name inside B; where that name is an output of the candidate, the extra output is skipped. Its value
is the tensor's own, through an ``Identity`` node: the tensor is still computed unfused, and the check
compares the boundary, as Polygraphy's check of its own candidates does.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set

#: characters for the marks, the first one no loaded name holds opening each extra name
MARKS = "#~^|!$"


class SkippedNames:
    """Chooses, per candidate, the names under which its extra outputs are not compared.

    Args:
        loaded: the tensor names of the check's ``--load-outputs`` file, in its order (Polygraphy's matching
            takes the first that fits).
        taken: every tensor name of the model (a new name must be none of them).

    Raises:
        ImportError: when Polygraphy is not installed (the check file could then not be read either).
    """

    def __init__(self, loaded: Sequence[str], taken: Set[str]):
        from polygraphy.util import find_str_in_iterable

        self._find = find_str_in_iterable
        self.loaded = list(loaded)
        used = set("".join(self.loaded))
        self.marks = [c for c in MARKS if c not in used]
        self.taken = taken
        self._matches: Dict[str, Optional[str]] = {}

    def _inside(self, base: str) -> Optional[str]:
        """The loaded name Polygraphy matches to ``base`` followed by mark characters (found once per base)."""
        if base not in self._matches:
            found = self._find(base + self.marks[0], self.loaded)
            self._matches[base] = found if isinstance(found, str) else None
        return self._matches[base]

    def names(self, compared: List[str], extra: List[str]) -> Dict[str, str]:
        """New names for ``extra`` (tensors the candidate outputs besides ``compared``, its boundary).

        A new name is ``<base><marks>``, which Polygraphy matches to ``match``, the first loaded name
        inside ``base``: a boundary output's base whose match is a boundary output, else an extra
        tensor's whose match the candidate outputs too (that one then keeps its name and is compared:
        ``Clip@13`` holds ``Clip@1``, which a prefix of a model computes).

        Args:
            compared: the candidate's outputs under their own names, in order.
            extra: the other tensors it outputs.

        Returns:
            ``{tensor: new name}`` for the extra tensors not compared: all of them, or all but the one
            whose name the others' match; ``{}`` when no name is safe (no mark character is free, or no
            base matches an output): the extra outputs then keep their names and are compared.
        """
        if not extra or not self.marks:
            return {}
        boundary, computed = set(compared), set(extra)
        base = next((b for b in compared if self._inside(b) in boundary), None)
        if base is None:
            base = next((m for m in extra if self._inside(m) in boundary | computed), None)
            if base is None:
                return {}
        shown = self._inside(base)
        opening, digits = self.marks[0], self.marks[1:] or [self.marks[0]]
        names: Dict[str, str] = {}
        k = 0
        for tensor in extra:
            if tensor == shown:
                continue
            while True:
                name = base + opening + _spelled(k, digits)
                k += 1
                if name not in self.taken:
                    break
            names[tensor] = name
        return names


def _spelled(k: int, digits: List[str]) -> str:
    """``k`` written with ``digits`` (base ``len(digits)``; one digit repeated ``k + 1`` times when only one)."""
    if len(digits) == 1:
        return digits[0] * (k + 1)
    out = digits[k % len(digits)]
    k //= len(digits)
    while k:
        out = digits[k % len(digits)] + out
        k //= len(digits)
    return out
