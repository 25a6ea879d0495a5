"""matplotlib, drawing to files only, from the optional ``bench`` extra.

The libraries never plot; the benchmarks and ``demo --graph`` do, after their JSON is
written, so a missing extra costs the picture and nothing else.
"""

from __future__ import annotations

from types import ModuleType

from ibe_pubsub.evaluation.exceptions import EvaluationError


class PlotsUnavailable(EvaluationError):
    """matplotlib is not installed."""


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise PlotsUnavailable("plots need matplotlib: pip install 'ibe-pubsub[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
