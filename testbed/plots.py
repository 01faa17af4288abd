"""Every plot of a results folder, drawn from the folder's own files: a run draws them
once it has written its tables, and `testbed report` draws the same from the same files.

    latency.csv, links.csv  ─▶ plots/latency_cdf.png, plots/port_rates.png
    flows.csv               ─▶ plots/flow_time_split.png
    pfc_timeline.csv        ─▶ plots/pfc_{backlog_bytes,paused_s,frames_sent,drops}.png
    dcqcn_rates.csv         ─▶ plots/dcqcn_rates.png
    timeline.csv            ─▶ timeline.png (a training step, per rank)
    flows.csv (open loop)   ─▶ plots/slowdown.png (testbed.flow_run)

One time axis for the series: seconds since the workload started. links.csv counts from
its sampler's start (metrics.json's workload_window_s is on that clock), dcqcn_rates.csv
from the workload's start, and pfc_timeline.csv from the PFC controller's start
(pfc.json's t0_monotonic_s), moved onto the workload's by metrics.json's
workload_start_monotonic_s.
"""

from __future__ import annotations

import csv
from pathlib import Path

from matplotlib.patches import Patch

from testbed import flow_run
from testbed.feature_plots import _figure
from testbed.features import FEATURES
from testbed.outputs import save_figure, save_plot
from testbed.results import read_tables, write_plots
from testbed.split_bars import SPLIT, bar_rows
from testbed.train_run import KIND_COLORS, KIND_NAMES


def draw_all(folder: Path, metrics: dict) -> list[Path]:
    """Every plot the folder's files hold data for; the paths written."""
    lat, samples = read_tables(folder)
    out = write_plots(folder, metrics, lat, samples)
    out += [p for p in [split_plot(folder)] if p]
    for feature in FEATURES:     # each feature's own, from the files it wrote
        out += feature.plots(folder, metrics)
    if (folder / "timeline.csv").exists():
        out += [p for p in [timeline_plot(folder)] if p]
    if metrics.get("open_loop"):
        out += [p for p in [flow_run.plot(folder, metrics["open_loop"])] if p]
    return out


def split_plot(folder: Path, k: int = 24) -> Path | None:
    """plots/flow_time_split.png from flows.csv: the `k` slowest split flows' times,
    part by part, each bar ending at most at its measured FCT (None when no flow was
    split)."""
    with open(folder / "flows.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("unexplained_s")]
    if not rows:
        return None
    shown = bar_rows(rows, k)
    fig, ax = _figure(9, 0.3 * len(shown) + 1.8)
    for j, part in enumerate(SPLIT):
        ax.barh(range(len(shown)), [seg[j][2] for _, seg, _ in shown],
                left=[seg[j][1] for _, seg, _ in shown], label=part.removesuffix("_s"))
    ax.scatter([float(r["fct_s"]) for r, _, _ in shown], range(len(shown)), marker="|",
               color="black", s=150, label="measured FCT", zorder=3)
    ax.set_yticks(range(len(shown)), [f"{r['node']}:{r['tag']}#{r['iteration']}{note}"
                                      for r, _, note in shown], fontsize=6)
    ax.set_xlabel("seconds (emulated time)")
    ax.set_title("Where the slowest flows' time went (each bar ends at its FCT; "
                 "(xF, why): parts scaled by F to fit)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return save_plot(fig, folder, "flow_time_split.png")


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
