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

MOST_SERIES = 12     # lines per DCQCN plot: the QPs with the most to show
MOST_PORTS = 8       # lines per PFC plot; every other port is in one grey band
# what earns a port one of the MOST_PORTS lines after the ports that dropped, by turns
RANKINGS = ("backlog_bytes", "paused_s", "frames_sent")
ALIKE = 0.01         # within this share of a port a ranking picked, a port adds no line
# one colour per picked port, the same in every PFC plot (grey is the band's)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#bcbd22", "#17becf")


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


def pick_ports(peaks: dict[str, dict[str, float]], most: int = MOST_PORTS) -> list[str]:
    """The ports that get a line of their own, in the legend's order, from each port's
    highest value of each PANELS column: every port that dropped (most drops first; the
    `most` that dropped most when more did), then by turns the port not yet picked with
    the largest backlog, the most paused time and the most pause frames sent, until
    `most`. A ranking passes over a port within ALIKE of a picked one in its column
    (fifteen hosts queued and paused alike are one line and the band); a port whose
    every value is zero gets none."""
    picked = sorted((n for n in peaks if peaks[n]["drops"] > 0),
                    key=lambda n: (-peaks[n]["drops"], n))[:most]
    ranked = [[n for n in sorted(peaks, key=lambda n: (-peaks[n][key], n))
               if peaks[n][key] > 0] for key in RANKINGS]
    while len(picked) < most and any(ranked):
        for key, order in zip(RANKINGS, ranked, strict=True):
            while order and (order[0] in picked or any(
                    abs(peaks[order[0]][key] - peaks[n][key]) <= ALIKE * peaks[n][key]
                    for n in picked)):
                order.pop(0)
            if order and len(picked) < most:
                picked.append(order.pop(0))
    return picked


def others_max(series: dict[str, list[tuple[float, dict[str, float]]]], names: list[str],
               key: str) -> list[tuple[float, float]]:
    """At each sample time, the highest `key` among the ports in `names` (the band)."""
    top: dict[float, float] = {}
    for name in names:
        for t, v in series[name]:
            top[t] = max(top.get(t, 0.0), v[key])
    return sorted(top.items())


def port_label(name: str, peak: dict[str, float]) -> str:
    """A picked port's legend entry: its name, and its drops when it dropped."""
    return name + (f" (drops {peak['drops']:,.0f})" if peak["drops"] > 0 else "")


def pfc_plots(folder: Path, metrics: dict) -> list[Path]:
    """Queue occupancy, paused time, pause frames and drops per port against time: one
    line each for the ports pick_ports picks (the same ports and colours in every plot),
    the others as one grey band (their highest value at each time), said in the legend."""
    series: dict[str, list[tuple[float, dict[str, float]]]] = {}
    with open(folder / "pfc_timeline.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            series.setdefault(f"{row['node']}:{row['ifname']}", []).append(
                (float(row["t_s"]), {k: float(row[k]) for k, _, _ in PANELS}))
    known = pfc_shift_s(folder, metrics)
    shift = known or 0.0
    axis = ("time since the workload started (s)" if known is not None
            else "time since the PFC controller started (s)")
    peaks = {n: {k: max(v[k] for _, v in rows) for k, _, _ in PANELS}
             for n, rows in series.items()}
    picked = pick_ports(peaks)
    others = [n for n in series if n not in picked]
    dropped = [n for n in others if peaks[n]["drops"] > 0]
    paths = []
    for key, label, scale in PANELS:
        fig, ax = _figure(10, 4, dpi=90)
        drawn = 0
        for name, color in zip(picked, COLORS, strict=False):
            if peaks[name][key] > 0:
                ax.plot([t + shift for t, _ in series[name]],
                        [v[key] * scale for _, v in series[name]], color=color,
                        linewidth=2.0 if peaks[name]["drops"] > 0 else 1.2,
                        label=port_label(name, peaks[name]))
                drawn += 1
        band = others_max(series, others, key)
        if any(v > 0 for _, v in band):
            drawn += 1
            ax.fill_between([t + shift for t, _ in band], [v * scale for _, v in band],
                            color="grey", alpha=0.35, linewidth=0,
                            label=f"{len(others)} other ports (their highest at each time"
                            + (f"; {len(dropped)} of them dropped "
                               f"{sum(peaks[n]['drops'] for n in dropped):,.0f})"
                               if dropped else ")"))
        ax.set_xlabel(axis)
        ax.set_ylabel(label)
        ax.set_title(f"PFC: {label} per port" + ("" if drawn else " (none)"))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      borderaxespad=0.0)
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
