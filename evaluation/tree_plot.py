"""A picture of the containment trees: one panel per attribute, nodes coloured by peer.

It draws what peers report of themselves (:func:`overlay.snapshot.tree_status`, the trees
of ``/status``): a simulated run's machines or a real run's ``/status`` answers, taken at
the end of the run. Each virtual peer is a node, placed by its depth and ordered along
its row by a walk down from the root, with an edge to each parent; roots are squares,
relays diamonds, and the colour names the physical peer that runs the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ibe_pubsub.evaluation.plotting import pyplot

Key = tuple[str, str]


@dataclass
class Panel:
    """One attribute tree laid out: node -> (x, y), its peer's index and kind, the edges."""

    attribute: str
    places: dict[Key, tuple[float, float]] = field(default_factory=dict)
    peer: dict[Key, int] = field(default_factory=dict)
    kind: dict[Key, str] = field(default_factory=dict)
    edges: list[tuple[Key, Key]] = field(default_factory=list)


def layout(statuses: Sequence[dict[str, Any]]) -> list[Panel]:
    """Panels, by attribute, of the peers' reported trees (``address`` and ``trees``)."""
    addresses = sorted({s["address"] for s in statuses})
    index = {a: i for i, a in enumerate(addresses)}
    vps: dict[str, dict[Key, dict[str, Any]]] = {}
    for status in statuses:
        for attribute, tree in status["trees"].items():
            for vp in tree["virtual_peers"]:
                vps.setdefault(attribute, {})[(status["address"], vp["vp"])] = vp
    return [_panel(attribute, nodes, index) for attribute, nodes in sorted(vps.items())]


def _ends(ends: Iterable[dict[str, str]]) -> list[Key]:
    return [(e["address"], e["vp"]) for e in ends]


def _panel(attribute: str, nodes: dict[Key, dict[str, Any]], index: dict[str, int]) -> Panel:
    panel = Panel(attribute)
    children = {key: [c for c in _ends(vp["children"]) if c in nodes]
                for key, vp in nodes.items()}
    tops = sorted(k for k, vp in nodes.items() if vp["root"])
    order: list[Key] = []
    depth: dict[Key, int] = {}
    stack = [(t, 0) for t in reversed(tops)]
    while stack:  # depth first from the root: subtrees stay together along each row
        key, d = stack.pop()
        if key in depth:
            continue
        depth[key] = nodes[key]["depth"] if nodes[key]["depth"] is not None else d
        order.append(key)
        stack += [(c, depth[key] + 1) for c in reversed(sorted(children[key]))]
    bottom = max(depth.values(), default=0) + 1
    for key in sorted(nodes):  # detached: below everything
        if key not in depth:
            depth[key] = bottom
            order.append(key)
    rows: dict[int, list[Key]] = {}
    for key in order:
        rows.setdefault(depth[key], []).append(key)
    for d, row in rows.items():
        for i, key in enumerate(row):
            panel.places[key] = ((i + 1) / (len(row) + 1), -float(d))
    for key, vp in nodes.items():
        panel.peer[key] = index[key[0]]
        panel.kind[key] = "root" if vp["root"] else "relay" if vp["relay"] else "vp"
        panel.edges += [(key, p) for p in _ends(vp["parents"]) if p in nodes]
    return panel


def draw_trees(statuses: Sequence[dict[str, Any]], path: str | Path, title: str) -> None:
    """Write the panels of :func:`layout` as a PNG."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    panels = layout(statuses)
    peers = len({s["address"] for s in statuses})
    colours = plt.get_cmap("tab20" if peers > 10 else "tab10")
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.5 * max(1, len(panels)), 5),
                             squeeze=False)
    markers = {"root": "s", "relay": "D", "vp": "o"}
    try:
        for ax, panel in zip(axes[0], panels, strict=False):
            for child, parent in panel.edges:
                (x0, y0), (x1, y1) = panel.places[child], panel.places[parent]
                ax.plot([x0, x1], [y0, y1], color="0.6", linewidth=0.8, zorder=1)
            for key, (x, y) in panel.places.items():
                ax.scatter([x], [y], s=90 if panel.kind[key] == "vp" else 130,
                           marker=markers[panel.kind[key]], zorder=2,
                           color=colours(panel.peer[key] % colours.N),
                           edgecolors="black" if panel.kind[key] != "vp" else "none")
            ax.set_title(f"{panel.attribute}: {len(panel.places)} virtual peers")
            ax.set_ylabel("depth")
            ax.set_xticks([])
            ax.set_yticks(sorted({y for _, y in panel.places.values()}))
            ax.set_yticklabels([str(int(-y)) for y in ax.get_yticks()])
        legend = [Line2D([], [], marker=m, linestyle="", color="0.4", label=k)
                  for k, m in markers.items()]
        fig.legend(handles=legend, loc="lower center", ncol=3, fontsize=8,
                   title=f"colour: one of {peers} physical peers", title_fontsize=8)
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
