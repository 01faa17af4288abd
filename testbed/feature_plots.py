"""The plots of the features that draw their own (testbed.features: the switches' PFC
timeline, congestion control's rates), from the files they wrote in a results folder.

    pfc_timeline.csv        ─▶ plots/pfc_{backlog_bytes,paused_s,frames_sent,drops}.png
    dcqcn_rates.csv         ─▶ plots/dcqcn_rates.png

pfc_timeline.csv counts from the PFC controller's start (pfc.json's t0_monotonic_s),
moved onto the workload's by metrics.json's workload_start_monotonic_s; dcqcn_rates.csv
counts from the workload's start.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from testbed.outputs import save_plot
from testbed.pfc_results import PANELS

MOST_SERIES = 12     # lines per plot: the ports or QPs with the most to show


def _figure(width: float, height: float, dpi: int = 110):
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def pfc_shift_s(folder: Path, metrics: dict) -> float | None:
    """What moves pfc_timeline.csv's times onto the workload's (None: not known, for a
    folder written before both clocks were recorded)."""
    start = metrics.get("workload_start_monotonic_s")
    try:
        t0 = json.loads((folder / "pfc.json").read_text()).get("t0_monotonic_s")
    except (OSError, ValueError, AttributeError):
        return None
    return t0 - start if isinstance(t0, float) and isinstance(start, float) else None


def pfc_plots(folder: Path, metrics: dict) -> list[Path]:
    """Queue occupancy, paused time, pause frames and drops per port against time: in
    each, the MOST_SERIES ports that reached the highest values (a port that dropped
    frames is never crowded out by a wall of hosts that merely queued)."""
    series: dict[str, list[tuple[float, dict[str, float]]]] = {}
    with open(folder / "pfc_timeline.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            series.setdefault(f"{row['node']}:{row['ifname']}", []).append(
                (float(row["t_s"]), {k: float(row[k]) for k, _, _ in PANELS}))
    shift = pfc_shift_s(folder, metrics)
    axis = ("time since the workload started (s)" if shift is not None
            else "time since the PFC controller started (s)")
    paths = []
    for key, label, scale in PANELS:
        peak = {name: max(v[key] for _, v in rows) for name, rows in series.items()}
        shown = sorted((n for n in peak if peak[n] > 0), key=lambda n: -peak[n])[:MOST_SERIES]
        fig, ax = _figure(8, 4, dpi=90)
        for name in sorted(shown):
            ax.plot([t + (shift or 0.0) for t, _ in series[name]],
                    [v[key] * scale for _, v in series[name]], label=name)
        ax.set_xlabel(axis)
        ax.set_ylabel(label)
        more = len([n for n in peak if peak[n] > 0]) - len(shown)
        ax.set_title(f"PFC: {label} per port" + ("" if shown else " (none)")
                     + (f" (the {len(shown)} highest; {more} more)" if more > 0 else ""))
        if shown:
            ax.legend(fontsize=7, loc="upper left")
        paths.append(save_plot(fig, folder, f"pfc_{key}.png"))
    return paths


def dcqcn_plot(folder: Path) -> Path | None:
    """Each QP's DCQCN rate after every cut and increase (dcqcn_rates.csv)."""
    rates: dict[str, list[tuple[float, float]]] = {}
    with open(folder / "dcqcn_rates.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            rates.setdefault(row["qp"], []).append((float(row["t_s"]), float(row["rate_mbps"])))
    if not rates:
        return None
    fig, ax = _figure(7, 4)
    qps = sorted(rates)
    for qp in qps[:MOST_SERIES]:
        ax.step([t for t, _ in rates[qp]], [r for _, r in rates[qp]], where="post", label=qp)
    ax.set_xlabel("time since the workload started (s)")
    ax.set_ylabel("DCQCN rate (Mbit/s, the sender's current rate)")
    ax.set_title("DCQCN: each QP's rate after every CNP and increase"
                 + (f" ({MOST_SERIES} of {len(qps)} QPs)" if len(qps) > MOST_SERIES else ""))
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)
    return save_plot(fig, folder, "dcqcn_rates.png")
