"""A matplotlib figure written whole or not at all: drawn to a temporary name beside its path, then moved there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` (a ``matplotlib.figure.Figure``) to ``path`` as PNG and close it.

    Raises:
        OSError: ``path``'s folder cannot be written (the figure is closed either way).
    """
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.stem + ".tmp.png")
    try:
        fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    os.replace(tmp, path)
    return path
