#!/usr/bin/env python3
"""PFC vs DCQCN: an incast beside a victim flow on five fabrics (claim 2, with ECN).

Claim: a RoCE fabric needs PFC for no loss, and DCQCN so that PFC rarely acts: with
both, the incast loses nothing and the victim behind it is no longer blocked.

Leaf-spine, 2 leaves x 4 hosts, one spine, uplinks at 4x the host rate, so the only
bottleneck is leaf1's port to l1h0. Incast: l0h0, l0h1, l0h2 -> l1h0; victim l0h3 ->
l1h1. Five fabrics, RoCE go-back-N, 512 KiB port buffers (PFC's headroom for a 400 Mbit/s
ingress fits; ECN marks far below XOFF, so DCQCN acts before PFC, as deployed):
  none        lossless class, no PFC, no ECN: drop-tail
  pfc         PFC on
  dcqcn       no PFC; switches mark CE (RED, ecn_kmin/kmax/pmax), receivers send CNPs,
              senders run DCQCN
  pfc+dcqcn   both
  pfc+voq     PFC on with virtual output queues: a lossless queue per destination on
              every switch-facing port, paused one destination at a time; no ECN
The scale factor defaults to 400: 100 Mbit/s stands for 40 Gb/s, the DCQCN paper's ports,
so its timers (50 us CNP interval, 55 us rate timers) run at 20 and 22 ms here.
Per fabric: incast JCT, victim throughput, pause frames, CE marks, CNPs, the congested
port's largest and time-averaged queue, drops, Jain fairness of the incast senders.

    sudo .venv/bin/python scripts/pfc_vs_ecn.py [--message-bytes 4000000] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.cc_results import jain, port_queue
from testbed.expect import Expectation, expectation_lines
from testbed.experiment import finite_float, from_toml
from testbed.hol_incast import INCAST, VICTIM, read_run
from testbed.rate import frame_bits
from testbed.results import (
    finish_script,
    marks_failure,
    new_folder,
    save_plot,
    script_exit,
)
from testbed.run import run

ROOT = Path(__file__).resolve().parent.parent

HOST_MBPS = 100.0
MODES = {"none": ("off", "off", "none"), "pfc": ("on", "off", "none"),
         "dcqcn": ("off", "on", "dcqcn"), "pfc+dcqcn": ("on", "on", "dcqcn"),
         "pfc+voq": ("on", "off", "none")}
DCQCN_SOURCE = "Zhu et al., Congestion Control for Large-Scale RDMA Deployments, SIGCOMM 2015"
HOL_SOURCE = "victim flow under PFC: Zhu et al., SIGCOMM 2015, sec. 2"
FLUID_SOURCE = "fluid bottleneck: the congested port drains at its line rate"
VOQ_SOURCE = ("VOQ: a queue per destination, no head-of-line blocking (Karol, Hluchyj, "
              "Morgan 1987; Ultra Ethernet's packet spraying + VOQ)")


def measure(base: Path, args, mode: str) -> dict:
    pfc, ecn, cc = MODES[mode]
    exp = from_toml(None, {
        "name": f"pfc_vs_ecn_{mode.replace('+', '_')}", "workload": "p2p",
        "pairs": INCAST + [VICTIM], "message_bytes": args.message_bytes, "iterations": 1,
        "transport": "roce", "entropy": "ecmp", "seed": args.seed, "pfc": pfc, "ecn": ecn,
        "cc": cc, "voq": "on" if mode == "pfc+voq" else "off", "results_dir": str(base),
        "timeout_s": 600.0, "rto_ms": 200.0,
        "topology": {"name": "leaf_spine", "kind": "leaf_spine",
                     "scale_factor": args.scale_factor, "params": {
                         "leaves": 2, "spines": 1, "hosts_per_leaf": 4,
                         "uplink_rate_mbps": 4 * HOST_MBPS,
                         "queue_bytes": args.queue_bytes}}})
    print(f"== {mode}: pfc {pfc}, ecn {ecn}, cc {cc}, voq {exp.voq}", flush=True)
    topo = exp.resolve_topology()
    folder, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    victim, incast, report = read_run(folder)
    t0 = report["t0_monotonic_s"]          # the timeline's clock; flows are in ns of it
    peak, mean = port_queue(folder, "leaf1", topo.ifname("leaf1", "l1h0"),
                            min(int(f["start_ns"]) for f in incast) / 1e9 - t0,
                            max(int(f["end_ns"]) for f in incast) / 1e9 - t0)
    goodputs = [float(f["goodput_mbps"]) for f in incast]
    cc_m = m.get("cc") or {}
    return {"mode": mode, "folder": folder.name,
            "incast_jct_s": max(float(f["fct_s"]) for f in incast),
            "victim_mbps": float(victim["goodput_mbps"]) if victim["goodput_mbps"] else 0.0,
            "pause_frames": report["totals"]["frames_sent"],
            "ce_marks": (report.get("ecn") or {}).get("marks", 0),
            "cnps": cc_m.get("cnps_sent", 0),
            "victim_cnps": ((cc_m.get("qps") or {}).get(VICTIM) or {}).get("cnps_sent", 0),
            "queue_max_bytes": peak, "queue_mean_bytes": round(mean),
            "drops": report["totals"]["drops"],
            "jain": jain(goodputs), "incast_goodput_mbps": goodputs,
            "retransmits": m["flows"]["retransmits"], "timeouts": m["flows"]["timeouts"],
            "exactly_once": m["flows"]["exactly_once"],
            "headroom": report["headroom"]["verdict"],
            "kmax_bytes": exp.ecn_kmax_bytes, "payload_bytes": exp.payload_bytes,
            "held_destinations": (report.get("voq") or {}).get("held_destinations", []),
            "fidelity": m["fidelity"]["verdict"]}


def expectations(rows: dict, message_bytes: int) -> list[Expectation]:
    n = len(INCAST)
    jct = n * message_bytes * 8 / (HOST_MBPS * 1e6)
    out = []
    for mode in ("pfc", "pfc+dcqcn", "pfc+voq"):
        r = rows[mode]
        out.append(Expectation(f"lossless drops, {mode}", "0 (headroom holds what arrives "
                               "while the pause travels)", "IEEE 802.1Qbb", 0, 0, r["drops"],
                               why_not=f"headroom {r['headroom']}, fidelity {r['fidelity']}"))
    out.append(Expectation("victim, pfc", f"B / n = {HOST_MBPS:g} / {n} Mbit/s (the paused "
                           "FIFOs carry it with the incast)", HOL_SOURCE, HOST_MBPS / n,
                           HOST_MBPS / n, rows["pfc"]["victim_mbps"], "Mbit/s",
                           why_not=f"{rows['pfc']['pause_frames']} pause frames"))
    for mode in ("dcqcn", "pfc+dcqcn"):
        r = rows[mode]
        out.append(Expectation(f"victim, {mode}", f"B = {HOST_MBPS:g} Mbit/s (DCQCN keeps the "
                               "queue near kmin: nothing pauses the victim's path)",
                               DCQCN_SOURCE, HOST_MBPS, HOST_MBPS, r["victim_mbps"], "Mbit/s",
                               why_not=f"{r['pause_frames']} pause frames; the victim drew "
                               f"{r['victim_cnps']} CNPs: its packets were marked CE in the "
                               "queues PFC paused upstream of the incast, which it shares"
                               if r["victim_cnps"] else f"{r['pause_frames']} pause frames, "
                               f"{r['drops']} drops"))
    voq = rows["pfc+voq"]
    line = HOST_MBPS * voq["payload_bytes"] * 8 / frame_bits(voq["payload_bytes"])
    out.append(Expectation("victim, pfc+voq", f"B x payload / frame = {HOST_MBPS:g} x "
                           f"{voq['payload_bytes']} / {frame_bits(voq['payload_bytes']) // 8} "
                           "Mbit/s (only the queues toward the incast's receiver are held)",
                           VOQ_SOURCE, line, line, voq["victim_mbps"], "Mbit/s",
                           why_not=f"held destinations "
                           f"{', '.join(voq['held_destinations']) or 'none'}, fidelity "
                           f"{voq['fidelity']}"))
    for mode in MODES:
        r = rows[mode]
        out.append(Expectation(f"incast JCT, {mode}", f"n S / B = {n} x {message_bytes} B / "
                               f"{HOST_MBPS:g} Mbit/s", FLUID_SOURCE, jct, jct,
                               r["incast_jct_s"], "s",
                               why_not=f"{r['drops']} drops, {r['timeouts']} timeouts"
                               if r["drops"] else "DCQCN's rate cuts leave the port idle "
                               "until its additive increase (R_AI = line / 1000 per 22 ms) "
                               "catches up" if r["cnps"] else f"fidelity {r['fidelity']}"))
    for mode in ("dcqcn", "pfc+dcqcn"):
        r = rows[mode]
        out.append(Expectation(f"incast fairness (Jain), {mode}", "1 (DCQCN converges to "
                               "the fair share)", DCQCN_SOURCE, 0.95, 1.0, r["jain"],
                               tolerance=0.0, why_not="each QP is cut by the CNPs it draws; "
                               "the additive increase is too slow to even them out in one "
                               "incast of this size"))
    return out


def plot(folder: Path, rows: dict) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.6), dpi=110)
    FigureCanvasAgg(fig)
    panels = (("incast_jct_s", "incast JCT (s)"), ("victim_mbps", "victim (Mbit/s)"),
              ("drops", "drops"), ("pause_frames", "pause frames"),
              ("queue_mean_bytes", "mean queue at l1h0 (B)"))
    colors = ["tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:purple"]
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        ax.bar(list(rows), [rows[m][key] for m in rows], color=colors)
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("3:1 incast beside a victim: drop-tail, PFC, DCQCN, both, PFC with VOQ "
                 "(measured)")
    return save_plot(fig, folder, "pfc_vs_ecn.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--message-bytes", type=int, default=4_000_000, help="bytes per flow")
    ap.add_argument("--scale-factor", type=finite_float, default=400.0,
                    help="real rate / emulated rate (400: 100 Mbit/s for 40 Gb/s, as in "
                    "the DCQCN paper); DCQCN's timers scale with it")
    ap.add_argument("--queue-bytes", type=int, default=512 << 10,
                    help="switch port buffer: 512 KiB holds PFC's headroom for a 400 Mbit/s "
                    "ingress (the run's headroom check says whether it does)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="1 MB per flow (about a minute)")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    if args.smoke:
        args.message_bytes = 1_000_000
    folder = new_folder(args.results, "pfc_vs_ecn")
    rows = {}
    with marks_failure(folder):
        for mode in MODES:
            rows[mode] = measure(folder, args, mode)
    made = plot(folder, rows)
    both, pfc, dcqcn, none = rows["pfc+dcqcn"], rows["pfc"], rows["dcqcn"], rows["none"]
    voq = rows["pfc+voq"]
    lines = ["# PFC vs DCQCN: an incast beside a victim", "",
             f"leaf-spine 2 x 4 hosts, one spine, uplinks 400 Mbit/s, hosts 100 Mbit/s "
             f"(x{args.scale_factor:g}: {HOST_MBPS * args.scale_factor / 1000:g} Gb/s), "
             f"{args.queue_bytes} B port buffers; incast {', '.join(INCAST)} beside the "
             f"victim {VICTIM}; "
             f"{args.message_bytes} B per flow, RoCE go-back-N. ECN: kmin 16 KiB, kmax 64 KiB, "
             "pmax 0.2; DCQCN: the paper's parameters, times x the scale factor.", "",
             f"**Finding:** drop-tail lost {none['drops']} packets; DCQCN alone "
             f"{dcqcn['drops']}; PFC {pfc['drops']} and PFC+DCQCN {both['drops']}. PFC sent "
             f"{pfc['pause_frames']} pause frames alone and {both['pause_frames']} with DCQCN; "
             f"the victim got {pfc['victim_mbps']:.1f} Mbit/s under PFC alone and "
             f"{both['victim_mbps']:.1f} with DCQCN beside it ({both['victim_cnps']} CNPs "
             "reached the victim: CE marks in the queues PFC paused, which it shares), and "
             f"{dcqcn['victim_mbps']:.1f} with DCQCN alone. DCQCN with the paper's "
             f"parameters took the incast from {pfc['incast_jct_s']:.2f} s (PFC alone) to "
             f"{both['incast_jct_s']:.2f} s: the line-rate start fills the queue, the CNPs "
             "that arrive while it drains cut each sender several times over, and the "
             "additive increase takes seconds to win the rate back. PFC with VOQ (no ECN): "
             f"{voq['drops']} drops, {voq['pause_frames']} pause frames, held the "
             f"queues toward {', '.join(voq['held_destinations']) or 'no destination'}; the "
             f"victim got {voq['victim_mbps']:.1f} Mbit/s and the incast ended in "
             f"{voq['incast_jct_s']:.2f} s.", "",
             "| fabric | incast JCT (s) | victim (Mbit/s) | pause frames | CE marks | CNPs | "
             "max queue (B) | mean queue / kmax | drops | Jain | retransmits | fidelity |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, r in rows.items():
        lines.append(f"| {mode} | {r['incast_jct_s']:.3f} | {r['victim_mbps']:.1f} | "
                     f"{r['pause_frames']} | {r['ce_marks']} | {r['cnps']} | "
                     f"{r['queue_max_bytes']} | {r['queue_mean_bytes'] / r['kmax_bytes']:.2f}"
                     f" | {r['drops']} | {r['jain']:.3f} | {r['retransmits']} | {r['fidelity']} |")
    expected = expectations(rows, args.message_bytes)
    lines += expectation_lines(expected)
    lines += ["", "Per run: queue and pause timelines (`plots/pfc_*.png`), DCQCN rates "
              "(`plots/dcqcn_rates.png`), CNPs in the pcaps: "
              + ", ".join(r["folder"] for r in rows.values())]
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {**rows, "expected": [e.to_dict() for e in expected]},
                         [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
