"""Every plot of a results folder, drawn from the folder's own files: a run draws them
once it has written its tables, and `testbed report` draws the same from the same files.

    latency.csv, links.csv  ─▶ plots/latency_cdf.png, plots/port_rates.png
    flows.csv               ─▶ plots/flow_time_split.png
    pfc_timeline.csv        ─▶ plots/pfc_{backlog_bytes,paused_s,frames_sent,drops}.png
    dcqcn_rates.csv         ─▶ plots/dcqcn_rates.png
    timeline.csv            ─▶ timeline.png (a training step, per rank)

One time axis for the series: seconds since the workload started. links.csv counts from
its sampler's start (metrics.json's workload_window_s is on that clock), dcqcn_rates.csv
from the workload's start, and pfc_timeline.csv from the PFC controller's start
(pfc.json's t0_monotonic_s), moved onto the workload's by metrics.json's
workload_start_monotonic_s.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from testbed import attribution
from testbed.outputs import save_figure, save_plot
from testbed.pfc_results import PANELS
from testbed.results import read_tables, write_plots
from testbed.train_run import KIND_COLORS, KIND_NAMES

MOST_SERIES = 12     # lines per plot: the ports or QPs with the most to show


def draw_all(folder: Path, metrics: dict) -> list[Path]:
    """Every plot the folder's files hold data for; the paths written."""
    lat, samples = read_tables(folder)
    out = write_plots(folder, metrics, lat, samples)
    out += [p for p in [attribution.plot(folder)] if p]
    if (folder / "pfc_timeline.csv").exists():
        out += pfc_plots(folder, metrics)
    if (folder / "dcqcn_rates.csv").exists():
        out += [p for p in [dcqcn_plot(folder)] if p]
    if (folder / "timeline.csv").exists():
        out += [p for p in [timeline_plot(folder)] if p]
    return out


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


def timeline_plot(folder: Path) -> Path | None:
    """timeline.png: per rank, what ran when in one training step (timeline.csv)."""
    with open(folder / "timeline.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return None
    ranks = list(dict.fromkeys(r["rank"] for r in rows))
    fig, ax = _figure(11, 0.35 * len(ranks) + 1.6)
    for r in rows:
        y, kind = ranks.index(r["rank"]), r["kind"]
        begin, done = float(r["begin_s"]), float(r["done_s"])
        if kind == "compute":
            ax.broken_barh([(begin, done - begin)], (y - 0.4, 0.8), color=KIND_COLORS[kind])
        else:
            ready = float(r["ready_s"])
            ax.broken_barh([(ready, max(done - ready, 1e-9))],
                           (y + 0.25, 0.15) if kind == "pp" else (y - 0.3, 0.6),
                           color=KIND_COLORS[kind], alpha=0.75)
    ax.set_yticks(range(len(ranks)), ranks)
    ax.invert_yaxis()
    ax.set_xlabel("emulated time since the step began (s)")
    ax.set_title(f"Training step {rows[0]['iteration']}: compute (full height), collectives "
                 "(inside), pipeline waits (thin)")
    used = {r["kind"] for r in rows}
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=KIND_NAMES[k]) for k in KIND_COLORS
                       if k in used], loc="upper right", fontsize=8)
    return save_figure(fig, folder / "timeline.png")
