#!/usr/bin/env python3
"""InfiniBand-like vs Ultra Ethernet-like vs Ethernet baseline on one rail-optimized
fabric (the background article's comparison table, measured).

Claim: a lossless fabric with adaptive routing (InfiniBand) and a sprayed, congestion-
controlled, loss-tolerant transport (Ultra Ethernet) both even out the load that static
ECMP leaves uneven; they differ in how they pay for it (pauses vs retransmissions).

The same workloads (a permutation of elephants, all-to-all, ring all-reduce) on the same
rail-optimized fabric in three fabric philosophies:
  ethernet    RoCE (go-back-N), static ECMP at the switches, PFC
  infiniband  RoCE (in order), PFC standing in for credit flow control, switch adaptive
              routing per packet (fabric.switch_lb): reordering shows up as NAKs
  ultra       UET-style transport (selective, unordered) sprayed per packet, NSCC on ECN
              marks, packet trimming at the switches (fabric.trimming), no PFC
  ultra_drop  the same without trimming: a full queue drops, as plain Ethernet does (the
              reference that shows what trimming buys)
The article's Ultra Ethernet column is packet spraying + VOQ; the ultra fabrics here run
without virtual output queues, since voq = "on" needs PFC and cannot yet run with ECN
marking or trimming (NO_VOQ), which they use.
Per fabric and workload: JCT against its ideal, p99 and p99.9 one-way latency, the
busiest leaf uplink over the mean, pause frames, drops, trimmed packets,
retransmissions, NAKs, RTO timeouts, and the run's fidelity verdict.

    sudo .venv/bin/python scripts/ib_vs_uec.py [--server-count 4 --gpus 4] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.expect import Expectation, expectation_lines
from testbed.experiment import finite_float, from_toml
from testbed.results import (
    finish_script,
    marks_failure,
    new_folder,
    save_plot,
    script_exit,
)
from testbed.run import run
from testbed.script_args import add_rate, add_server_count

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS = ("permutation", "alltoall", "allreduce")
FABRICS = {
    "ethernet": {"transport": "roce", "entropy": "ecmp", "pfc": "on"},
    "infiniband": {"transport": "roce", "entropy": "ecmp", "pfc": "on",
                   "switch_lb": "adaptive"},
    "ultra": {"transport": "uet", "entropy": "spray", "pfc": "off", "ecn": "on",
              "cc": "nscc", "nscc_target_qdelay_us": 1.0, "trimming": "on"},
    "ultra_drop": {"transport": "uet", "entropy": "spray", "pfc": "off", "ecn": "on",
                   "cc": "nscc", "nscc_target_qdelay_us": 1.0},
}
ARTICLE = "background article: InfiniBand vs Ultra Ethernet (shared/seeds)"
NO_VOQ = ("The article's Ultra Ethernet is packet spraying + VOQ; the ultra fabrics run "
          "without VOQ: voq = \"on\" needs PFC on (they run PFC off) and cannot yet run with "
          "ECN marking or trimming, which read a port's lossless queue as one FIFO (NSCC's "
          "marks and the trims).")


def measure(base: Path, args, fabric: str, workload: str) -> dict:
    exp = from_toml(None, {
        "name": f"{fabric}_{workload}", "workload": workload,
        "message_bytes": args.message_bytes, "iterations": args.iterations,
        "seed": args.seed, "results_dir": str(base), "timeout_s": 600.0, "rto_ms": 200.0,
        "window_packets": args.window, **FABRICS[fabric],
        "topology": {"name": "rail_optimized", "kind": "rail_optimized", "params": {
            "servers": args.servers, "gpus_per_server": args.gpus, "spines": 2,
            "rate_mbps": args.rate_mbps}}})
    print(f"== {fabric}: {workload}", flush=True)
    _, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    pfc = m.get("pfc") or {}
    totals = pfc.get("totals") or {}
    return {"jct_s": m["jct_mean_s"], "jct_over_ideal": m["jct_over_ideal"],
            "p99_us": m["latency_us"]["p99"], "p999_us": m["latency_us"]["p999"],
            "uplink_max_over_mean": m["links"]["uplink_max_over_mean"],
            "pause_frames": totals.get("frames_sent", 0),
            "drops": m["links"]["drops"],       # fabric drops, lossless class included
            "retransmits": m["flows"]["retransmits"], "naks": m["flows"]["naks"],
            "timeouts": m["flows"]["timeouts"],
            "trimmed": (pfc.get("trimming") or {}).get("trimmed", 0),
            "trimmed_received": m["flows"]["trimmed"],
            "exactly_once": m["flows"]["exactly_once"],
            "steered": (pfc.get("switch_lb") or {}).get("steered", 0),
            "fidelity": m["fidelity"]["verdict"]}


def ratio(value: float | None) -> str:
    """An uplink max/mean ("n/a": no leaf carried enough to compare its uplinks)."""
    return "n/a" if value is None else f"{value:.2f}x"


def plot(folder: Path, rows: dict) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.6), dpi=110)
    FigureCanvasAgg(fig)
    panels = (("jct_over_ideal", "JCT / ideal"), ("uplink_max_over_mean",
                                                  "busiest uplink / mean"),
              ("pause_frames", "pause frames"), ("retransmits", "retransmissions"))
    width = 0.2
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for k, fabric in enumerate(FABRICS):
            ax.bar([w + (k - 1.5) * width for w in range(len(WORKLOADS))],
                   [rows[fabric][w][key] or 0 for w in WORKLOADS], width, label=fabric)
        ax.set_xticks(range(len(WORKLOADS)), WORKLOADS, fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7)
    fig.suptitle("Ethernet (ECMP + PFC) vs InfiniBand-like (adaptive + PFC) vs "
                 "Ultra Ethernet-like (spray + NSCC + trimming; and without trimming), measured",
                 fontsize=10)
    return save_plot(fig, folder, "ib_vs_uec.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_count(ap)
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per server")
    add_rate(ap, type=finite_float, default=25.0,
             help="endpoint link rate (25: 16 ranks stay faithful on 2 cores)")
    ap.add_argument("--message-bytes", type=int, default=1 << 20)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--window", type=int, default=16, help="transport window (packets)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="2 servers x 2 GPUs, 256 KiB")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    if args.smoke:
        args.servers, args.gpus, args.message_bytes, args.iterations = 2, 2, 256 << 10, 1
    folder = new_folder(args.results, "ib_vs_uec")
    rows: dict = {f: {} for f in FABRICS}
    with marks_failure(folder):
        for fabric in FABRICS:
            for workload in WORKLOADS:
                rows[fabric][workload] = measure(folder, args, fabric, workload)
    made = plot(folder, rows)
    eth, ib, ue, drop = (rows[f]["permutation"] for f in FABRICS)
    trims = sum(rows["ultra"][w]["trimmed"] for w in WORKLOADS)
    got = sum(rows["ultra"][w]["trimmed_received"] for w in WORKLOADS)
    a2a, a2a_drop = rows["ultra"]["alltoall"], rows["ultra_drop"]["alltoall"]
    lines = ["# Ethernet vs InfiniBand-like vs Ultra Ethernet-like", "",
             f"rail-optimized, {args.servers} servers x {args.gpus} GPUs at "
             f"{args.rate_mbps:g} Mbit/s, 2 spines; {args.message_bytes} B per rank, "
             f"{args.iterations} iterations, window {args.window} packets, seed {args.seed}.",
             "", f"**Finding:** on the permutation of elephants the busiest uplink carried "
             f"{ratio(eth['uplink_max_over_mean'])} the mean with ECMP, "
             f"{ratio(ib['uplink_max_over_mean'])} with adaptive routing and "
             f"{ratio(ue['uplink_max_over_mean'])} with spraying; Ethernet paid with "
             f"{eth['pause_frames']} pause frames, InfiniBand-like with {ib['pause_frames']} "
             f"and {ib['naks']} NAKs (adaptive routing reorders an in-order transport), "
             f"Ultra Ethernet-like with {ue['trimmed']} trimmed packets, {ue['drops']} "
             f"drops and {ue['retransmits']} retransmissions ({ue['timeouts']} timeouts; "
             f"without trimming {drop['drops']} drops, {drop['retransmits']} "
             f"retransmissions, {drop['timeouts']} timeouts). Over the three workloads the "
             f"switches trimmed {trims} packets and {got} arrived trimmed, each NAKed at "
             f"once; on all-to-all, trimming took JCT to {a2a['jct_over_ideal']:.2f}x ideal "
             f"({a2a['trimmed']} trims, {a2a['timeouts']} timeouts) against "
             f"{a2a_drop['jct_over_ideal']:.2f}x with drops ({a2a_drop['drops']} drops, "
             f"{a2a_drop['timeouts']} timeouts).", "", NO_VOQ,
             "", "| fabric | workload | JCT (s) | JCT / ideal | p99 (us) | p99.9 (us) | "
             "uplink max / mean | pauses | drops | trimmed | retransmits | NAKs | timeouts "
             "| fidelity |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for fabric in FABRICS:
        for w in WORKLOADS:
            r = rows[fabric][w]
            lines.append(f"| {fabric} | {w} | {r['jct_s']:.3f} | {r['jct_over_ideal']:.3f} | "
                         f"{r['p99_us']:.0f} | {r['p999_us']:.0f} | "
                         f"{ratio(r['uplink_max_over_mean'])} | {r['pause_frames']} | "
                         f"{r['drops']} | {r['trimmed']} | {r['retransmits']} | "
                         f"{r['naks']} | {r['timeouts']} | {r['fidelity']} |")
    expected = [Expectation(f"uplink max / mean, permutation, {f}", "1 (every uplink "
                            "equally loaded)" + (": ECMP leaves collisions" if f ==
                                                 "ethernet" else ""), ARTICLE, 1.0, 1.0,
                            rows[f]["permutation"]["uplink_max_over_mean"],
                            why_not="static ECMP: hash collisions" if f == "ethernet"
                            else f"fidelity {rows[f]['permutation']['fidelity']}")
                for f in FABRICS if rows[f]["permutation"]["uplink_max_over_mean"]]
    expected += [Expectation(f"lossless drops, {f}, {w}", "0 (PFC)", "IEEE 802.1Qbb", 0, 0,
                             rows[f][w]["drops"], why_not="see the run's headroom verdict")
                 for f in ("ethernet", "infiniband") for w in WORKLOADS]
    expected += [Expectation(f"RTO timeouts, ultra (trimming), {w}", "0 (a full queue "
                             "trims; the receiver NAKs, the sender resends at once)",
                             "UEC 1.0 packet trimming", 0, 0, rows["ultra"][w]["timeouts"],
                             why_not="a loss trimming did not cover (a drop before the "
                             "threshold, or a trimmed frame or NAK lost)")
                 for w in WORKLOADS]
    lines += expectation_lines(expected)
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {**rows, "expected": [e.to_dict() for e in expected]},
                         [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
