"""One place for the evaluation's plot style (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def figure(path: str | Path, title: str, xlabel: str, panels: Sequence[tuple[str, Any]],
           log: bool = False) -> Iterator[list[tuple[Any, Any]]]:
    """Yield ``(axes, tag)`` per panel, side by side, each panel given as ``(ylabel, tag)``;
    on exit label them, add legends and save the figure as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    pairs = [(ax, tag) for ax, (_, tag) in zip(axes[0], panels, strict=True)]
    try:
        yield pairs
        for ax, (ylabel, _) in zip(axes[0], panels, strict=True):
            ax.set(xlabel=xlabel, ylabel=ylabel)
            if log:
                ax.set_xscale("log")
                ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
