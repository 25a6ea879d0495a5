"""One place for the evaluation's plot style (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ibe_pubsub.evaluation.plotting import pyplot


@contextmanager
def figure(path: str | Path, title: str, xlabel: str, panels: Sequence[tuple[str, Any]],
           log: bool = False) -> Iterator[list[tuple[Any, Any]]]:
    """Yield ``(axes, tag)`` per panel, side by side, each panel given as ``(ylabel, tag)``;
    on exit label them, add legends and save the figure as PNG."""
    plt = pyplot()

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


def _mean_ms(run: dict[str, Any], key: str, stat: str = "mean") -> float | None:
    s = run[key]
    return s[stat] * 1e3 if s.get("count") else None


def overheads(report: dict[str, Any], key: str, stat: str = "mean") -> list[float | None]:
    """Secure minus plaintext delay (ms) by the statistic ``stat``, row by row."""
    out = []
    for row in report["rows"]:
        secure, plain = (_mean_ms(row[m], key, stat) for m in ("secure", "plaintext"))
        out.append(None if secure is None or plain is None else secure - plain)
    return out


def overhead_stats(report: dict[str, Any], key: str) -> dict[str, list[float | None]]:
    """Overheads of the mean and of the median: joins that time out and retry weigh on
    the mean far more than on the median."""
    return {stat: overheads(report, key, stat) for stat in ("mean", "median")}


def _delays(report: dict[str, Any], path: Path, x_key: str, xlabel: str, key: str,
            title: str, band: tuple[float, float]) -> None:
    x = [r[x_key] for r in report["rows"]]
    with figure(path, title, xlabel, [("delay (ms)", "delay"),
                                      ("security overhead (ms)", "overhead")]) as axes:
        (delay_ax, _), (over_ax, _) = axes
        for label, color in (("secure", "tab:blue"), ("plaintext", "tab:orange")):
            for stat, style in (("mean", "-"), ("median", "--")):
                delay_ax.plot(x, [_mean_ms(r[label], key, stat) for r in report["rows"]],
                              marker="o", linestyle=style, color=color,
                              label=f"{label} ({stat})")
        for stat, style in (("mean", "-"), ("median", "--")):
            over_ax.plot(x, overheads(report, key, stat), marker="o", color="tab:red",
                         linestyle=style, label=f"this run: secure - plaintext ({stat})")
        over_ax.axhspan(*band, color="tab:gray", alpha=0.25, label="the report's overhead")
        delay_ax.set_ylim(bottom=0)


def connection_vs_peers(report: dict[str, Any], path: Path) -> None:
    _delays(report, path, "peers", "peers", "connection_s",
            f"Connection delay vs. peers (out-degree {report['max_children']})", (230, 300))


def connection_vs_degree(report: dict[str, Any], path: Path) -> None:
    _delays(report, path, "max_children", "maximum out-degree", "connection_s",
            f"Connection delay vs. out-degree ({report['peers']} peers)", (230, 300))


def dissemination_vs_peers(report: dict[str, Any], path: Path) -> None:
    _delays(report, path, "peers", "peers", "dissemination_s",
            f"Dissemination delay vs. peers ({report['publishers']} publishers x "
            f"{report['events_per_publisher']} events)", (150, 250))


def routing(report: dict[str, Any], path: Path) -> None:
    peers = [r["peers"] for r in report["rows"]]
    panels = [("false positives per subscriber", "false_positives_per_subscriber"),
              ("messages per event", "messages_per_event")]
    with figure(path, "One-hop flooding vs. multi-credential routing", "peers",
                panels) as axes:
        for ax, key in axes:
            for i, strategy in enumerate(("ohf", "mcr")):
                ax.bar([k + i * 0.4 for k in range(len(peers))],
                       [r[strategy][key] for r in report["rows"]], width=0.4,
                       label=strategy.upper())
            ax.set_xticks([k + 0.2 for k in range(len(peers))], [str(p) for p in peers])


def calibration(report: dict[str, Any], path: Path) -> None:
    ops = sorted(op for op in report["costs_ms"] if op not in report["not_measured"])
    panels = [("ms per call (measured)", "costs"), ("mean delay (ms)", "check")]
    with figure(path, f"Crypto costs on real cryptography ({report['peers']} peers)",
                "", panels) as axes:
        (cost_ax, _), (check_ax, _) = axes
        cost_ax.bar(ops, [report["costs_ms"][op] for op in ops], label="mean per call")
        cost_ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        kinds = ["connection_s", "dissemination_s"]
        for i, label in enumerate(("real", "modelled")):
            check_ax.bar([k + i * 0.4 for k in range(len(kinds))],
                         [_mean_ms(report[label], k) or 0 for k in kinds], width=0.4,
                         label=f"{label} crypto")
        check_ax.set_xticks([k + 0.2 for k in range(len(kinds))], ["connection", "dissemination"])


def loopback(report: dict[str, Any], path: Path) -> None:
    stats = ("mean", "median", "p95")
    panels = [("dissemination delay (ms)", "delay"), ("delivery ratio", "ratio")]
    with figure(path, f"Simulator vs. {report['peers']} real peer processes on loopback",
                "", panels) as axes:
        (delay_ax, _), (ratio_ax, _) = axes
        for i, label in enumerate(("processes", "simulator")):
            run = report[label]["dissemination_s"]
            delay_ax.bar([k + i * 0.4 for k in range(len(stats))],
                         [run.get(s, 0) * 1e3 for s in stats], width=0.4, label=label)
            ratio_ax.bar([i], [report[label]["delivery_ratio"]], label=label)
        delay_ax.set_xticks([k + 0.2 for k in range(len(stats))], list(stats))
        ratio_ax.set_xticks([0, 1], ["processes", "simulator"])
        ratio_ax.set_ylim(0, 1.05)
