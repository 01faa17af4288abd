#!/usr/bin/env python3
"""A permutation and an all-to-all under ECMP or spraying, each with PFC or with virtual
output queues.

Claim: a queue per destination (VOQ) keeps PFC's losslessness without its head-of-line
blocking; spraying evens out the load ECMP's hash leaves uneven. Which of the two a
workload needs depends on where it congests: a permutation on a non-blocking fabric
congests only where ECMP's hash collides, an all-to-all congests every receiver's port
(many-to-one), which is where per-destination queues matter.

4 x 4 leaf-spine, 4 hosts a leaf (16 endpoints), uplinks at the hosts' rate
(non-blocking). Both workloads (`permutation`, `alltoall`) under four fabrics
(testbed.voq_fabric): ecmp+pfc (RoCE, ECMP, PFC), ecmp+voq (the same, voq on),
spray+pfc (UET-style transport sprayed per packet, PFC), spray+voq (the same, voq on).
Per run: JCT / ideal, the spines' lossless egress queue p99 (of the PFC controller's
samples), pause frames, the switches that sent an XOFF (the hops the backpressure
reached), the destinations VOQ held, lossless drops, retransmissions and the fidelity
verdict; the permutation's JCT beside its ideal S / B and ECMP's collision model.

    sudo .venv/bin/python scripts/voq_fabric.py [--message-bytes 1048576] [--rate 25]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.benchmarks import machine_line
from testbed.expect import Expectation, expectation_lines
from testbed.experiment import rate_arg
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit
from testbed.script_args import add_rate, rate_flag_error
from testbed.voq_fabric import FABRICS, WORKLOADS, FabricKnobs, measure

ROOT = Path(__file__).resolve().parent.parent

SPRAY_SOURCE = ("a permutation on a non-blocking Clos: every host sends S at its line rate "
                "B when the load is spread evenly (packet spraying; Dixit et al., "
                "INFOCOM 2013)")
COLLISION_SOURCE = ("ECMP's hash collisions: max-min on the kernel's paths "
                    "(testbed.attribution.collision_model_s; Al-Fares et al., NSDI 2010)")
LOSSLESS_SOURCE = "IEEE 802.1Qbb (PFC; VOQ pauses per destination with PFC's thresholds)"
SCHEDULED_SOURCE = ("credit-scheduled fabric: each egress grants its line rate among the "
                    "queues with bytes for it (Meta's DSF, 2025; EQDS, NSDI 2022)")


def expectations(rows: dict) -> list[Expectation]:
    """The permutation's ideal S / B where the fabric sprays, ECMP's collision model where
    it hashes, and no lossless drop anywhere (PFC and VOQ both pause before a drop); the
    scheduled fabric's all-to-all at its ideal too, with no pause."""
    out = []
    for fabric in FABRICS:
        r = rows[fabric]["permutation"]
        why = (f"fidelity {r['fidelity']}, {r['pause_frames']} pause frames, "
               f"{r['retransmits']} retransmits")
        if fabric.startswith("spray") or fabric == "scheduled":
            out.append(Expectation(
                f"permutation JCT, {fabric}", f"S / B = the run's ideal (B = "
                f"{r['link_mbps']:g} Mbit/s)", SPRAY_SOURCE, r["ideal_s"], r["ideal_s"],
                r["jct_s"], "s", why_not=why))
        elif r["collision_model_s"]:
            out.append(Expectation(
                f"permutation JCT, {fabric}", "max-min on the hashed paths, all flows "
                "starting together", COLLISION_SOURCE, r["collision_model_s"],
                r["collision_model_s"], r["jct_s"], "s", why_not=why))
    sch = rows["scheduled"]["alltoall"]
    why = f"fidelity {sch['fidelity']}, {sch['retransmits']} retransmits"
    out += [Expectation("all-to-all JCT, scheduled", f"the run's ideal (every receiver's "
                        f"port busy at B = {sch['link_mbps']:g} Mbit/s)", SCHEDULED_SOURCE,
                        sch["ideal_s"], sch["ideal_s"], sch["jct_s"], "s", why_not=why),
            Expectation("pause frames, scheduled, all-to-all", "0 (credits, not pauses)",
                        SCHEDULED_SOURCE, 0, 0, sch["pause_frames"], why_not=why)]
    out += [Expectation(f"lossless drops, {fabric}, {w}", "0 (no byte enters without a "
                        "grant)" if fabric == "scheduled" else "0 (a pause before the "
                        "buffer fills; headroom for what is in flight)",
                        SCHEDULED_SOURCE if fabric == "scheduled" else LOSSLESS_SOURCE, 0, 0,
                        rows[fabric][w]["lossless_drops"],
                        why_not=f"headroom {rows[fabric][w]['headroom']}")
            for fabric in FABRICS for w in WORKLOADS]
    return out


def plot(folder: Path, rows: dict) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), dpi=110)
    FigureCanvasAgg(fig)
    panels = (("jct_over_ideal", "JCT / ideal", 1.0),
              ("spine_queue_p99_bytes", "spines' queue p99 (kB, controller samples)", 1e-3))
    width = 0.8 / len(FABRICS)
    colors = ("tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:red")
    for i, (key, label, scale) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for k, fabric in enumerate(FABRICS):
            ax.bar([w + (k - (len(FABRICS) - 1) / 2) * width for w in range(len(WORKLOADS))],
                   [(rows[fabric][w][key] or 0) * scale for w in WORKLOADS], width,
                   label=fabric, color=colors[k])
        ax.set_xticks(range(len(WORKLOADS)), WORKLOADS)
        ax.set_title(label, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        if i == 0:
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.legend(fontsize=8)
    fig.suptitle("permutation and all-to-all: ECMP / spray x PFC / VOQ, and the scheduled "
                 "fabric (measured)",
                 fontsize=10)
    return save_plot(fig, folder, "voq_fabric.png")


def finding(rows: dict) -> str:
    """What the runs show about VOQ on these workloads, from the numbers."""
    parts = []
    for w in WORKLOADS:
        cells = []
        for base in ("ecmp", "spray"):
            pfc, voq = rows[f"{base}+pfc"][w], rows[f"{base}+voq"][w]
            change = voq["jct_over_ideal"] / pfc["jct_over_ideal"] - 1
            cells.append(f"{base} {pfc['jct_over_ideal']:.2f}x ideal with PFC, "
                         f"{voq['jct_over_ideal']:.2f}x with VOQ ({change:+.0%}; "
                         f"spines' queue p99 {pfc['spine_queue_p99_bytes'] / 1e3:.0f} -> "
                         f"{voq['spine_queue_p99_bytes'] / 1e3:.0f} kB, pause hops "
                         f"{pfc['pause_hops']} -> {voq['pause_hops']}, "
                         f"{len(voq['held_destinations'])} destinations held)")
        sch = rows["scheduled"][w]
        cells.append(f"scheduled {sch['jct_over_ideal']:.2f}x ideal (spines' queue p99 "
                     f"{sch['spine_queue_p99_bytes'] / 1e3:.0f} kB, {sch['pause_frames']} "
                     "pause frames)")
        parts.append(f"{w}: " + "; ".join(cells))
    unfaithful = [f"{r['fabric']} {r['workload']}" for f in FABRICS for r in rows[f].values()
                  if r["fidelity"] != "faithful"]
    return ("**Finding:** " + ". ".join(parts) + ". One run each: "
            + (f"not faithful ({', '.join(unfaithful)}), so their JCTs include the "
               "emulator's own delays; " if unfaithful else "all faithful; ")
            + "a permutation on a non-blocking fabric congests only where the hash "
            "collides, so per-destination queues have little to hold apart there; an "
            "all-to-all's many-to-one at every receiver is where they can keep one "
            "receiver's pause off the others' traffic.")


def table(rows: dict) -> list[str]:
    lines = ["| fabric | workload | JCT (s) | JCT / ideal | spine queue p99 (kB) | "
             "pause frames | pause hops (switches that sent XOFF) | held destinations | "
             "lossless drops | retransmits | fidelity |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for fabric in FABRICS:
        for w in WORKLOADS:
            r = rows[fabric][w]
            held = str(len(r["held_destinations"])) if r["voq"] else "- (whole class)"
            lines.append(f"| {fabric} | {w} | {r['jct_s']:.3f} | {r['jct_over_ideal']:.3f} | "
                         f"{r['spine_queue_p99_bytes'] / 1e3:.1f} | {r['pause_frames']} | "
                         f"{r['pause_hops']} ({', '.join(r['switches_that_paused']) or '-'})"
                         f" | {held} | {r['lossless_drops']} | {r['retransmits']} | "
                         f"{r['fidelity']} |")
    return lines


def refusal(args) -> str:
    """What is wrong with the arguments, in one line ("" when nothing is)."""
    for flag, value in (("--message-bytes", args.message_bytes), ("--window", args.window)):
        if value < 1:
            return f"{flag} {value}: must be at least 1"
    return rate_flag_error(args.rate_mbps) if args.rate_mbps else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--message-bytes", type=int, default=1 << 20,
                    help="bytes each host sends (the workload's message)")
    add_rate(ap, default="25",
             help="endpoint link rate in Mbit/s, or auto (default 25: 16 endpoints stay "
                  "faithful on 2 cores; the topology's own is 100)")
    ap.add_argument("--window", type=int, default=16,
                    help="transport window (packets)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true",
                    help="2 leaves x 2 spines x 2 hosts, 128 KiB")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    bad = refusal(args)
    if bad:
        print(f"voq_fabric: {bad}", file=sys.stderr)
        return 2
    knobs = FabricKnobs(message_bytes=args.message_bytes,
                        rate=rate_arg(args.rate_mbps) if args.rate_mbps else "",
                        window_packets=args.window, seed=args.seed)
    if args.smoke:
        knobs.message_bytes, knobs.leaves, knobs.spines, knobs.hosts_per_leaf = \
            128 << 10, 2, 2, 2
    folder = new_folder(args.results, "voq_fabric")
    rows: dict = {f: {} for f in FABRICS}
    with marks_failure(folder):
        for fabric in FABRICS:
            for workload in WORKLOADS:
                rows[fabric][workload] = measure(folder, fabric, workload, knobs)
    made = plot(folder, rows)
    rate = rows["ecmp+pfc"]["permutation"]["link_mbps"]
    lines = ["# A permutation and an all-to-all: ECMP / spray x PFC / VOQ", "",
             f"leaf-spine {knobs.leaves} leaves x {knobs.spines} spines x "
             f"{knobs.hosts_per_leaf} hosts, hosts and uplinks at {rate:g} Mbit/s "
             f"(non-blocking); {knobs.message_bytes} B a host, window "
             f"{knobs.window_packets} packets, seed {knobs.seed}; {machine_line()}.", "",
             finding(rows), "",
             "Spine queue p99: the 99th percentile of the PFC controller's samples of every "
             "spine port's lossless backlog (pfc_timeline.csv) while the workload ran. Pause hops: "
             "the switches that sent an XOFF (PFC's, or a VOQ pause of one destination's "
             "queue). Held destinations: the destinations whose queues a VOQ pause held.",
             "", *table(rows)]
    expected = expectations(rows)
    lines += expectation_lines(expected)
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {**rows, "expected": [e.to_dict() for e in expected]},
                         [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
