"""One line as a long stretch of a large model's run starts and one as it ends, so that no stretch of more than
a few seconds passes without a word on the terminal (a 2.8 GB decoder's run was silent for 50 s while its weights
were converted and its nodes ranked).

A stretch is said only for a model of ``LARGE_BYTES`` of weights or more: a small model's stretches take
milliseconds, and its log stays as it was.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator

log = logging.getLogger(__name__)

#: weights (bytes) from which a model's stretches are said: where loading, converting or running it takes seconds
LARGE_BYTES = 512 * 2**20


@contextlib.contextmanager
def stretch(what: str, weight_bytes: int) -> Iterator[None]:
    """Log ``what`` (a phrase: "Converting the weights to float16") as the stretch starts and its seconds as it
    ends, when the model holds ``weight_bytes`` bytes of weights, ``LARGE_BYTES`` or more; nothing otherwise.

    Args:
        what: the stretch, as a sentence without its final stop.
        weight_bytes: the bytes of weights of the model the stretch works on (``weight_file.weight_bytes``).
    """
    if weight_bytes < LARGE_BYTES:
        yield
        return
    log.info("%s (%.1f GB of weights) ...", what, weight_bytes / 1e9)
    started = time.monotonic()
    yield
    log.info("%s: done in %.1f s", what, time.monotonic() - started)
