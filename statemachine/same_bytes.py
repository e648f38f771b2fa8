"""A copy of a file this run has checked takes that check's verdict instead of a second check.

The written answer (``strategies.answer_check``) is loaded back from ``output=`` and checked as
written; for a reduce with a command check it is byte for byte the file its search checked last
(the needed nodes alone), so a second check of it would run the same program on the same bytes.
Where the checker's verdict is a function of the file alone (``Checker.verdict_by_bytes``, and no
``artifacts.iter_info`` file tells the check which candidate it judges), the lifecycle notes the
SHA-256 of each file it writes (up to ``DIGEST_BYTES``), and a candidate that copies another
(``Candidate.twin``) whose file holds the same bytes takes the verdict of its twin's check in this
run. A verdict from a loaded replay is never taken this way: its file was not seen.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, Optional

from runner.candidates import Candidate

#: files larger than this are not hashed (a check of a copy then runs, as it always did): at most about
#: 0.06 s of hashing per check
DIGEST_BYTES = 64 * 2**20


def file_digest(path: Path) -> Optional[str]:
    """The SHA-256 of ``path`` (hex), or None when it is missing or larger than ``DIGEST_BYTES``."""
    try:
        if path.stat().st_size > DIGEST_BYTES:
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                digest.update(block)
        return digest.hexdigest()
    except OSError:
        return None


class SameBytes:
    """The digests of the files written for this run's checks, by candidate key.

    Args:
        enabled: the checker's verdict is a function of the file alone (``Checker.verdict_by_bytes``);
            False: nothing is hashed and no copy takes a verdict.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._digests: Dict[str, str] = {}

    def note(self, candidate: Candidate, path: Path) -> None:
        """``candidate``'s file was written at ``path`` to be checked: remember its digest."""
        if self.enabled and candidate.twin is None:
            digest = file_digest(path)
            if digest is not None:
                self._digests[candidate.key] = digest

    def copy_of(self, candidate: Candidate, path: Path) -> bool:
        """Whether ``candidate``, a copy of another (``twin``) written at ``path``, holds the very bytes
        of its twin's file checked this run."""
        if not self.enabled or candidate.twin is None or candidate.twin not in self._digests:
            return False
        return file_digest(path) == self._digests[candidate.twin]
