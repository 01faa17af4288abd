#!/usr/bin/env python3
"""Scale sweep: where this machine stops being a faithful emulator.

Ring all-reduce on a non-blocking one-tier fabric (one switch plane) as the number of
ranks grows. For each size: measured JCT against the ideal 2(n-1)/n * S / B, busbw
against the link rate, the machine's CPU load while the workload ran, and the run's own
fidelity verdict (testbed.fidelity): where it is not faithful, the emulator, not the
network, set the pace. Writes one folder with every run inside, plots and summary.md.

    sudo .venv/bin/python scripts/scale_sweep.py [--ranks 2 4 8 16] [--rate-mbps 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.expect import expectation_lines, ring_allreduce  # noqa: E402
from testbed.experiment import from_toml  # noqa: E402
from testbed.results import finish_script, marks_failure, new_folder, script_exit  # noqa: E402
from testbed.run import run  # noqa: E402

FAITHFUL = 1.10  # JCT within 10% of ideal


def measure(base: Path, n: int, args) -> dict:
    exp = from_toml(None, {
        "name": f"allreduce{n}", "workload": "allreduce", "message_bytes": args.message_bytes,
        "iterations": args.iterations, "transport": args.transport, "entropy": "ecmp",
        "seed": args.seed, "results_dir": str(base), "timeout_s": 300.0, "rto_ms": 200.0,
        "topology": {"name": f"nonblocking{n}", "kind": "one_tier",
                     "params": {"nodes": n, "planes": 1, "rate_mbps": args.rate_mbps}}})
    print(f"== {n} ranks", flush=True)
    folder, m = run(exp, progress=lambda msg: print(f"   {msg}", file=sys.stderr, flush=True))
    return {"ranks": n, "folder": folder.name, "jct_s": m["jct_mean_s"], "ideal_s": m["ideal_s"],
            "jct_over_ideal": m["jct_over_ideal"], "busbw_over_link": m["busbw_over_link"],
            "cpu_mean_percent": m["cpu"]["cpu_mean_percent"],
            "cpu_max_percent": m["cpu"]["cpu_max_percent"],
            "fidelity": m["fidelity"]["verdict"],
            "retransmits": m["flows"]["retransmits"]}


def plot(folder: Path, rows: list[dict]) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ranks = [r["ranks"] for r in rows]
    ax.plot(ranks, [r["jct_over_ideal"] for r in rows], "o-", label="JCT / ideal")
    ax.plot(ranks, [r["busbw_over_link"] for r in rows], "s-", label="busbw / link rate")
    ax.axhline(FAITHFUL, color="grey", ls="--", lw=1, label="JCT within 10% of ideal")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.set_xlabel("ranks (ring all-reduce, non-blocking fabric)")
    ax.set_ylabel("ratio (measured)")
    ax2 = ax.twinx()
    ax2.bar(ranks, [r["cpu_mean_percent"] for r in rows], width=[n * 0.25 for n in ranks],
            alpha=0.25, color="tab:red", label="CPU load (%)")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("machine CPU while running (%)")
    lines, labels = ax.get_legend_handles_labels()
    bars, blabels = ax2.get_legend_handles_labels()
    ax.legend(lines + bars, labels + blabels, fontsize=8, loc="upper left")
    ax.set_title("fidelity vs scale on this machine")
    fig.tight_layout()
    path = folder / "plots" / "fidelity_vs_ranks.png"
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--rate-mbps", type=float, default=100.0)
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
            rows.append(measure(folder, n, args))
    made = plot(folder, rows)
    faithful = [r["ranks"] for r in rows
                if r["jct_over_ideal"] <= FAITHFUL and r["fidelity"] == "faithful"]
    last = rows[-1]
    lines = ["# Scale sweep: ring all-reduce fidelity on this machine", "",
             f"one-tier non-blocking fabric, {args.rate_mbps:g} Mbit/s per link, "
             f"{args.message_bytes} B per rank, {args.iterations} iterations, "
             f"{args.transport}, seed {args.seed}.", "",
             "**Finding:** " + (f"JCT stays within 10% of ideal up to {max(faithful)} ranks"
                                if faithful else "JCT is never within 10% of ideal")
             + f"; at {last['ranks']} ranks JCT/ideal is {last['jct_over_ideal']:.2f}, busbw "
             f"{last['busbw_over_link']:.2f} of the link rate, "
             f"CPU {last['cpu_mean_percent']:.0f}%.",
             "", "| ranks | JCT (s) | ideal (s) | JCT / ideal | busbw / link | CPU mean % | "
             "retransmits | fidelity |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = r["jct_over_ideal"] <= FAITHFUL and r["fidelity"] == "faithful"
        word = "faithful" if ok else "off by >10%" if r["fidelity"] == "faithful" \
            else r["fidelity"]
        lines.append(f"| {r['ranks']} | {r['jct_s']:.3f} | {r['ideal_s']:.3f} | "
                     f"{r['jct_over_ideal']:.3f} | {r['busbw_over_link']:.3f} | "
                     f"{r['cpu_mean_percent']:.0f} | {r['retransmits']} | "
                     f"{word} |")
    expected = [ring_allreduce(
        f"ring all-reduce JCT, {r['ranks']} ranks", r["ideal_s"], r["jct_s"],
        why_not=f"fidelity {r['fidelity']}, CPU {r['cpu_mean_percent']:.0f}%: the emulator, "
                "not the network, set the pace" if r["fidelity"] != "faithful"
        else f"{r['retransmits']} retransmits") for r in rows]
    lines += expectation_lines(expected)
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {"runs": rows,
                                        "expected": [e.to_dict() for e in expected]}, [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
