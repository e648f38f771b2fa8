"""Give the C allocator's free memory back to the system between checks (glibc only).

glibc serves allocations under its dynamic mmap threshold (which grows up to 32 MB after the first
large free) from its heap, and a heap fragmented by freed weight tensors keeps its free pages: a
precision run of a 212 MB decoder kept a candidate's size per check (``benchmarks/memory.py``).
``malloc_trim`` hands free pages anywhere in the heap back (``madvise``). A fixed mmap threshold
did the same at 1.6x the run time (each large block mapped and faulted in anew). Standard library
only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Optional

_trim: Optional[Any] = None
_looked = False


def trim() -> bool:
    """Return the C heap's free pages to the system (``malloc_trim(0)``); False where the C library
    has no ``malloc_trim`` (musl, macOS). Costs milliseconds: call it between checks, not in loops."""
    global _trim, _looked
    if not _looked:
        _looked = True
        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError, TypeError):
            _trim = None
    if _trim is None:
        return False
    _trim(0)
    return True
