"""A matplotlib figure written whole or not at all: drawn to a temporary name beside its path, then moved there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runner.write_guard import check_write


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` (a ``matplotlib.figure.Figure``) to ``path`` as PNG and close it.

    Raises:
        OSError: ``path``'s folder cannot be written (the figure is closed either way).
        ArtifactError: ``path`` is a file a running run reads (``runner.write_guard``).
    """
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.stem + ".tmp.png")
    try:
        check_write(path, "a figure")
        fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    os.replace(tmp, path)
    return path
