#!/usr/bin/env python3
"""PFC: no loss, but head-of-line blocking and congestion spreading (claim 2).

Claim: PFC prevents loss but spreads congestion and blocks unrelated flows.

Leaf-spine, 2 leaves x 4 hosts, one spine, uplinks at 4x the host rate (a leaf's four
hosts at line rate fit its uplink: at 3x, the incast's three senders and the victim
oversubscribed leaf0's uplink and the victim lost there too), so the only bottleneck is
leaf1's port to l1h0. Incast: l0h0, l0h1, l0h2 -> l1h0. Victim: l0h3 ->
l1h1, an uncongested receiver whose path shares the spine with the incast. Run with
the lossless class (DSCP 26) paused by PFC (on) and left to drop (off), RoCE go-back-N.
Reports lossless drops, pause frames and where they reached, the victim's throughput,
go-back-N retransmissions; each run's folder has the queue occupancy and pause
timelines (plots/pfc_*.png) and summary.md compares the two.

    sudo .venv/bin/python scripts/pfc_hol.py [--message-bytes 3000000]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from testbed.expect import Expectation, expectation_lines
from testbed.experiment import from_toml
from testbed.rate import frame_bits
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit
from testbed.run import run

ROOT = Path(__file__).resolve().parent.parent

INCAST = ["l0h0>l1h0", "l0h1>l1h0", "l0h2>l1h0"]
VICTIM = "l0h3>l1h1"
HOST_MBPS = 100.0
UPLINK_MBPS = 4 * HOST_MBPS             # a leaf's 4 hosts at line rate: non-blocking
HOL_SOURCE = "victim flow under PFC: Zhu et al., DCQCN, SIGCOMM 2015, sec. 2"
FLUID_SOURCE = "fluid bottleneck: the congested port drains at its line rate"


def expectations(rows: dict, message_bytes: int) -> list[Expectation]:
    """Fluid head-of-line model: PFC pauses the whole upstream path, so the paused FIFOs
    carry the victim and the incast flows alike, in proportion to what their hosts send
    (each host paused by leaf0 the same way). The congested port drains B, shared by n
    incast flows, so every flow through the pauses, the victim too, gets B/n; the incast
    ends after n S / B. Without PFC nothing pauses the victim and no link on its path is
    oversubscribed (uplinks carry a leaf's hosts at line rate), so it gets its line rate;
    the incast's loss under go-back-N has no model."""
    n = len(INCAST)
    on, off = rows["on"], rows["off"]
    jct = n * message_bytes * 8 / (HOST_MBPS * 1e6)
    payload = off["payload_bytes"]
    line = HOST_MBPS * payload * 8 / frame_bits(payload)     # goodput at line rate
    why = f"fidelity {on['fidelity']}, {on['retransmits']} retransmits"
    return [
        Expectation("victim with PFC off", f"B x payload / frame = {HOST_MBPS:g} x "
                    f"{payload} / {frame_bits(payload) // 8} Mbit/s (its own link; uplinks "
                    f"{UPLINK_MBPS:g} Mbit/s)", FLUID_SOURCE, line, line, off["victim_mbps"],
                    "Mbit/s",
                    why_not=f"fidelity {off['fidelity']}, {off['retransmits']} retransmits"),
        Expectation("victim with PFC on", f"B / n = {HOST_MBPS:g} / {n} Mbit/s", HOL_SOURCE,
                    HOST_MBPS / n, HOST_MBPS / n, on["victim_mbps"], "Mbit/s", why_not=why),
        Expectation("incast JCT with PFC on", f"n S / B = {n} x {message_bytes} B / "
                    f"{HOST_MBPS:g} Mbit/s", FLUID_SOURCE, jct, jct, on["incast_jct_s"], "s",
                    why_not=why),
        Expectation("lossless drops with PFC on", "0 (headroom holds what arrives while "
                    "the pause travels)", "IEEE 802.1Qbb", 0, 0, on["lossless_drops"],
                    why_not=f"headroom {on['headroom']}"),
    ]


def measure(base: Path, args, mode: str) -> dict:
    """One run: PFC "off", "on", or "voq" (PFC on with a queue per destination)."""
    exp = from_toml(None, {
        "name": f"pfc_{mode}", "workload": "p2p", "pairs": INCAST + [VICTIM],
        "message_bytes": args.message_bytes, "iterations": 1, "transport": "roce",
        "entropy": "ecmp", "seed": args.seed, "pfc": "off" if mode == "off" else "on",
        "voq": "on" if mode == "voq" else "off", "window_packets": args.window,
        "pfc_xoff_bytes": args.xoff, "pfc_xon_bytes": args.xoff // 2,
        "results_dir": str(base), "timeout_s": 300.0, "rto_ms": 200.0,
        "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 1, "hosts_per_leaf": 4,
            "uplink_rate_mbps": UPLINK_MBPS,
            "queue_bytes": args.queue_bytes}}})
    print(f"== PFC {mode}", flush=True)
    folder, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    with open(folder / "flows.csv") as fh:
        flows = list(csv.DictReader(fh))
    victim = next(f for f in flows if f["role"] == "recv" and f["tag"].endswith(VICTIM))
    incast = [f for f in flows if f["role"] == "send" and f["tag"].split(".", 1)[1] in INCAST]
    report = json.loads((folder / "pfc.json").read_text())
    paused_by = sorted({port.split(":")[0] for port, c in report["ports"].items()
                        if c["xoff_frames"]})
    return {"mode": mode, "folder": folder.name,
            "victim_mbps": float(victim["goodput_mbps"]) if victim["goodput_mbps"] else 0.0,
            "victim_fct_s": float(victim["fct_s"]) if victim["fct_s"] else None,
            "incast_jct_s": max(float(f["fct_s"]) for f in incast),
            "lossless_drops": report["totals"]["drops"],
            "pause_frames": report["totals"]["frames_sent"],
            "paused_s": report["totals"]["paused_s"],
            "switches_that_paused": paused_by,
            "retransmits": m["flows"]["retransmits"], "exactly_once": m["flows"]["exactly_once"],
            "headroom": report["headroom"]["verdict"],
            "reaction_ms_p50": report["reaction_ms"].get("p50"),
            "fidelity": m["fidelity"]["verdict"], "payload_bytes": exp.payload_bytes}


def plot(folder: Path, rows: dict) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), dpi=110)
    FigureCanvasAgg(fig)
    panels = (("victim_mbps", "victim throughput (Mbit/s)"),
              ("lossless_drops", "lossless-class drops"),
              ("retransmits", "go-back-N retransmissions"))
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        modes = ["off", "on"]
        ax.bar([f"PFC {m}" for m in modes], [rows[m][key] for m in modes],
               color=["tab:orange", "tab:blue"])
        ax.set_title(label, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("incast beside a victim flow: PFC off vs on (measured)")
    return save_plot(fig, folder, "pfc_off_vs_on.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--message-bytes", type=int, default=3_000_000, help="bytes per flow")
    ap.add_argument("--queue-bytes", type=int, default=2 << 20, help="switch port buffer")
    ap.add_argument("--xoff", type=int, default=150_000, help="XOFF threshold (bytes)")
    ap.add_argument("--window", type=int, default=512, help="packets in flight per flow")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    folder = new_folder(args.results, "pfc_hol")
    rows = {}
    with marks_failure(folder):
        for mode in ("off", "on"):
            rows[mode] = measure(folder, args, mode)
    made = plot(folder, rows)
    on, off = rows["on"], rows["off"]
    lines = ["# PFC: loss vs head-of-line blocking", "",
             f"leaf-spine 2 x 4 hosts, one spine, uplinks {UPLINK_MBPS:g} Mbit/s, hosts "
             f"{HOST_MBPS:g} Mbit/s, "
             f"{args.queue_bytes} B port buffers, XOFF {args.xoff} B; incast "
             f"{', '.join(INCAST)} beside the victim {VICTIM}; {args.message_bytes} B per "
             "flow, RoCE go-back-N.", "",
             f"**Finding:** PFC on: {on['lossless_drops']} lossless drops (off: "
             f"{off['lossless_drops']}); the victim, whose receiver is not congested, got "
             f"{on['victim_mbps']:.1f} Mbit/s with PFC and {off['victim_mbps']:.1f} without "
             + ("(head-of-line blocking: it waits behind the paused incast)"
                if on["victim_mbps"] < off["victim_mbps"] else
                "(no head-of-line loss this run: see the expected vs measured table)")
             + "; pauses were sent by "
             f"{', '.join(on['switches_that_paused']) or 'no switch'} "
             f"(each pauses the hop before it: the pause reached "
             f"{len(on['switches_that_paused'])} hops upstream of the congested port).",
             "", "| PFC | victim (Mbit/s) | incast JCT (s) | lossless drops | pause frames | "
             "paused (s) | retransmits | headroom | reaction p50 (ms) | fidelity |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mode in ("off", "on"):
        r = rows[mode]
        lines.append(f"| {mode} | {r['victim_mbps']:.1f} | {r['incast_jct_s']:.3f} | "
                     f"{r['lossless_drops']} | {r['pause_frames']} | {r['paused_s']} | "
                     f"{r['retransmits']} | {r['headroom']} | {r['reaction_ms_p50']} | "
                     f"{r['fidelity']} |")
    expected = expectations(rows, args.message_bytes)
    lines += expectation_lines(expected)
    lines += ["", "Queue occupancy and pause timelines per port: "
              + ", ".join(f"{r['folder']}/plots/pfc_*.png" for r in rows.values())]
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {**rows, "expected": [e.to_dict() for e in expected]},
                         [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
