"""Matplotlib for the benchmarks' plots: pyplot on the Agg backend and one way to save a figure.

matplotlib comes with the bench extra; without it a benchmark prints a line and draws no plot.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> ModuleType | None:
    """matplotlib.pyplot on the Agg backend, or None (after saying so) if matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(
    fig: Figure, path: Path, title: str | None = None, dpi: int = 110, title_size: int = 9
) -> None:
    """Titles (when given), lays out, writes and closes the figure."""
    import matplotlib.pyplot as plt

    if title is not None:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
