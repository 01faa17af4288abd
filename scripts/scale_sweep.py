#!/usr/bin/env python3
"""Scale sweep: where this machine stops being a faithful emulator.

Ring all-reduce on a non-blocking one-tier fabric (one switch plane) as the number of
ranks grows, with one agent process per rank (per-rank) and with one process per core
serving several ranks (per-core, traffic.host), side by side. For each size and
layout: measured JCT against the ideal 2(n-1)/n * S / B, busbw against the link rate,
the machine's CPU load while the workload ran, and the run's own fidelity verdict
(testbed.fidelity): where it is not faithful, the emulator, not the network, set the
pace. Writes one folder with every run inside, one plot (JCT/ideal and the verdict
against ranks, both layouts) and summary.md.

    sudo .venv/bin/python scripts/scale_sweep.py [--ranks 2 4 8 16 32]
        [--layouts per-rank per-core]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.expect import expectation_lines, ring_allreduce
from testbed.experiment import finite_float, from_toml
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit
from testbed.run import run
from testbed.script_args import add_rate
from traffic.launch import AGENT_LAYOUTS

ROOT = Path(__file__).resolve().parent.parent

FAITHFUL = 1.10  # JCT within 10% of ideal
VERDICT_MARKERS = {"faithful": "o", "degraded": "s", "unfaithful": "X"}


def measure(base: Path, n: int, args, layout: str = "per-core") -> dict:
    exp = from_toml(None, {
        "name": f"allreduce{n}_{layout.replace('-', '_')}", "workload": "allreduce",
        "message_bytes": args.message_bytes, "agent_processes": AGENT_LAYOUTS[layout](n),
        "iterations": args.iterations, "transport": args.transport, "entropy": "ecmp",
        "seed": args.seed, "results_dir": str(base), "timeout_s": 300.0, "rto_ms": 200.0,
        "topology": {"name": f"nonblocking{n}", "kind": "one_tier",
                     "params": {"nodes": n, "planes": 1, "rate_mbps": args.rate_mbps}}})
    print(f"== {n} ranks, {layout} layout", flush=True)
    folder, m = run(exp, progress=lambda msg: print(f"   {msg}", file=sys.stderr, flush=True))
    return {"ranks": n, "layout": layout, "folder": folder.name, "jct_s": m["jct_mean_s"],
            "ideal_s": m["ideal_s"],
            "jct_over_ideal": m["jct_over_ideal"], "busbw_over_link": m["busbw_over_link"],
            "cpu_mean_percent": m["cpu"]["cpu_mean_percent"],
            "cpu_max_percent": m["cpu"]["cpu_max_percent"],
            "fidelity": m["fidelity"]["verdict"],
            "retransmits": m["flows"]["retransmits"]}


def plot(folder: Path, rows: list[dict]) -> Path:
    """JCT/ideal against ranks, one line per layout, each point marked by its verdict;
    the machine's CPU load behind, as bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(7, 4.4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    ranks = sorted({r["ranks"] for r in rows})
    layouts = [e for e in AGENT_LAYOUTS if any(r["layout"] == e for r in rows)]
    colors = {"per-rank": "tab:grey", "per-core": "tab:blue"}
    for k, layout in enumerate(layouts):
        got = sorted((r for r in rows if r["layout"] == layout), key=lambda r: r["ranks"])
        xs = [r["ranks"] for r in got]
        ax.plot(xs, [r["jct_over_ideal"] for r in got], "-", color=colors[layout],
                label=f"{layout}: JCT / ideal")
        for r in got:
            ax.plot(r["ranks"], r["jct_over_ideal"], VERDICT_MARKERS.get(r["fidelity"], "o"),
                    color=colors[layout], ms=8)
        shift = 0.9 if k == 0 else 1.1      # bars side by side on the log axis
        ax2.bar([x * shift for x in xs], [r["cpu_mean_percent"] for r in got],
                width=[x * 0.18 for x in xs], alpha=0.2, color=colors[layout])
    ax.axhline(FAITHFUL, color="grey", ls="--", lw=1, label="JCT within 10% of ideal")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("ranks (ring all-reduce, non-blocking fabric)")
    ax.set_ylabel("JCT / ideal (measured)")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("machine CPU while running (%, bars)")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    lines, labels = ax.get_legend_handles_labels()
    marks = [Line2D([], [], ls="", marker=m, color="black", label=f"verdict: {v}")
             for v, m in VERDICT_MARKERS.items()]
    ax.legend(lines + marks, labels + [m.get_label() for m in marks], fontsize=8,
              loc="upper left")
    ax.set_title("fidelity vs scale on this machine: a process per rank, per core")
    return save_plot(fig, folder, "fidelity_vs_ranks.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--layouts", nargs="+", choices=list(AGENT_LAYOUTS),
                    default=list(AGENT_LAYOUTS))
    add_rate(ap, type=finite_float, default=100.0)
    ap.add_argument("--message-bytes", type=int, default=4 << 20)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--transport", choices=["roce", "uet"], default="roce")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    if min(args.ranks) < 2:
        ap.error("--ranks: every size must be at least 2")
    folder = new_folder(args.results, "scale_sweep")
    rows = []
    with marks_failure(folder):
        for n in sorted(args.ranks):
            for layout in args.layouts:     # side by side: the same minute of the machine
                rows.append(measure(folder, n, args, layout))
    made = plot(folder, rows)
    findings = []
    for layout in args.layouts:
        got = [r for r in rows if r["layout"] == layout]
        faithful = [r["ranks"] for r in got
                    if r["jct_over_ideal"] <= FAITHFUL and r["fidelity"] == "faithful"]
        last = got[-1]
        findings.append(
            f"{layout}: " + (f"JCT within 10% of ideal, faithful, up to "
                                    f"{max(faithful)} ranks" if faithful
                                    else "never faithful within 10% of ideal")
            + f"; at {last['ranks']} ranks JCT/ideal {last['jct_over_ideal']:.2f}, busbw "
            f"{last['busbw_over_link']:.2f} of the link rate, CPU "
            f"{last['cpu_mean_percent']:.0f}%, {last['fidelity']}.")
    lines = ["# Scale sweep: ring all-reduce fidelity on this machine", "",
             f"one-tier non-blocking fabric, {args.rate_mbps:g} Mbit/s per link, "
             f"{args.message_bytes} B per rank, {args.iterations} iterations, "
             f"{args.transport}, seed {args.seed}; per-rank: one agent process per rank, "
             "per-core: one per core.", "", "**Findings:**", ""]
    lines += [f"- {f}" for f in findings]
    lines += ["", "| ranks | layout | JCT (s) | ideal (s) | JCT / ideal | busbw / link | "
              "CPU mean % | retransmits | fidelity |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = r["jct_over_ideal"] <= FAITHFUL and r["fidelity"] == "faithful"
        word = "faithful" if ok else "off by >10%" if r["fidelity"] == "faithful" \
            else r["fidelity"]
        lines.append(f"| {r['ranks']} | {r['layout']} | {r['jct_s']:.3f} | {r['ideal_s']:.3f} | "
                     f"{r['jct_over_ideal']:.3f} | {r['busbw_over_link']:.3f} | "
                     f"{r['cpu_mean_percent']:.0f} | {r['retransmits']} | "
                     f"{word} |")
    expected = [ring_allreduce(
        f"ring all-reduce JCT, {r['ranks']} ranks, {r['layout']} layout", r["ideal_s"],
        r["jct_s"],
        why_not=f"fidelity {r['fidelity']}, CPU {r['cpu_mean_percent']:.0f}%: the emulator, "
                "not the network, set the pace" if r["fidelity"] != "faithful"
        else f"{r['retransmits']} retransmits") for r in rows]
    lines += expectation_lines(expected)
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {"runs": rows,
                                        "expected": [e.to_dict() for e in expected]}, [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
