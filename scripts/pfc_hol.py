#!/usr/bin/env python3
"""PFC: no loss, but head-of-line blocking and congestion spreading (claim 2), and
virtual output queues that keep the first without the second.

Claim: PFC prevents loss but spreads congestion and blocks unrelated flows; a queue
per destination (VOQ) paused one destination at a time stops the incast without
blocking the victim.

Leaf-spine, 2 leaves x 4 hosts, one spine, uplinks at 4x the host rate (a leaf's four
hosts at line rate fit its uplink: at 3x, the incast's three senders and the victim
oversubscribed leaf0's uplink and the victim lost there too), so the only bottleneck is
leaf1's port to l1h0. Incast: l0h0, l0h1, l0h2 -> l1h0. Victim: l0h3 ->
l1h1, an uncongested receiver whose path shares the spine with the incast
(testbed.hol_incast). Three runs, RoCE go-back-N on the lossless class (DSCP 26): left
to drop (PFC off), paused by PFC (on), and paused per destination (voq: PFC on, every
switch-facing port's lossless class split into one queue per destination).
Reports lossless drops, pause frames, the victim's throughput, the incast's JCT,
go-back-N retransmissions, and where the backpressure reached: the switches that sent
an XOFF (PFC's or a VOQ pause; their count is the pause hops, the congested switch
included), and under VOQ the destinations whose queues were held and how many held
queues fed a destination other than the incast's receiver. Each run's folder has the
queue occupancy and pause timelines (plots/pfc_*.png); summary.md compares the three.

    sudo .venv/bin/python scripts/pfc_hol.py [--message-bytes 3000000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.expect import Expectation, expectation_lines
from testbed.hol_incast import (
    CLAIM2_MODES,
    HOST_MBPS,
    INCAST,
    RECEIVER,
    UPLINK_MBPS,
    VICTIM,
    HolKnobs,
    incast_jct_s,
    line_goodput_mbps,
    measure,
)
from testbed.rate import frame_bits
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit

ROOT = Path(__file__).resolve().parent.parent

HOL_SOURCE = "victim flow under PFC: Zhu et al., DCQCN, SIGCOMM 2015, sec. 2"
FLUID_SOURCE = "fluid bottleneck: the congested port drains at its line rate"
VOQ_SOURCE = ("VOQ: a queue per destination, no head-of-line blocking (Karol, Hluchyj, "
              "Morgan 1987; Ultra Ethernet's packet spraying + VOQ)")
LABELS = {"off": "PFC off", "on": "PFC on", "voq": "VOQ", "scheduled": "scheduled"}
SCHEDULED_SOURCE = ("credit-scheduled fabric: the egress grants its line rate among the "
                    "queues with bytes for it, nothing enters unscheduled (Meta's DSF, "
                    "2025; EQDS, Olteanu et al., NSDI 2022)")
MODES = CLAIM2_MODES


def expectations(rows: dict, message_bytes: int) -> list[Expectation]:
    """Fluid head-of-line model: PFC pauses the whole upstream path, so the paused FIFOs
    carry the victim and the incast flows alike, in proportion to what their hosts send
    (each host paused by leaf0 the same way). The congested port drains B, shared by n
    incast flows, so every flow through the pauses, the victim too, gets B/n; the incast
    ends after n S / B. Without PFC nothing pauses the victim and no link on its path is
    oversubscribed (uplinks carry a leaf's hosts at line rate), so it gets its line rate;
    the incast's loss under go-back-N has no model. With VOQ only the queues toward the
    incast's receiver are held: the victim keeps its line rate, the incast still drains
    at B (n S / B) without a drop, and no queue toward another destination is held.
    Scheduled: l1h0's egress grants its line rate among the incast's three queues, l1h1's
    to the victim alone: the victim at its line rate, the incast in n S / B, with no
    pause sent and no drop."""
    n = len(INCAST)
    on, off, voq, sch = rows["on"], rows["off"], rows["voq"], rows["scheduled"]
    jct = incast_jct_s(message_bytes)
    payload = off["payload_bytes"]
    line = line_goodput_mbps(payload)
    line_formula = (f"B x payload / frame = {HOST_MBPS:g} x {payload} / "
                    f"{frame_bits(payload) // 8} Mbit/s (its own link; uplinks "
                    f"{UPLINK_MBPS:g} Mbit/s)")
    jct_formula = f"n S / B = {n} x {message_bytes} B / {HOST_MBPS:g} Mbit/s"
    why = f"fidelity {on['fidelity']}, {on['retransmits']} retransmits"
    why_voq = (f"fidelity {voq['fidelity']}, {voq['retransmits']} retransmits, held "
               f"destinations {', '.join(voq['held_destinations']) or 'none'}")
    why_sch = f"fidelity {sch['fidelity']}, {sch['retransmits']} retransmits"
    return [
        Expectation("victim with PFC off", line_formula, FLUID_SOURCE, line, line,
                    off["victim_mbps"], "Mbit/s",
                    why_not=f"fidelity {off['fidelity']}, {off['retransmits']} retransmits"),
        Expectation("victim with PFC on", f"B / n = {HOST_MBPS:g} / {n} Mbit/s", HOL_SOURCE,
                    HOST_MBPS / n, HOST_MBPS / n, on["victim_mbps"], "Mbit/s", why_not=why),
        Expectation("incast JCT with PFC on", jct_formula, FLUID_SOURCE, jct, jct,
                    on["incast_jct_s"], "s", why_not=why),
        Expectation("lossless drops with PFC on", "0 (headroom holds what arrives while "
                    "the pause travels)", "IEEE 802.1Qbb", 0, 0, on["lossless_drops"],
                    why_not=f"headroom {on['headroom']}"),
        Expectation("victim under VOQ", line_formula, VOQ_SOURCE, line, line,
                    voq["victim_mbps"], "Mbit/s", why_not=why_voq),
        Expectation("incast JCT under VOQ", jct_formula, FLUID_SOURCE, jct, jct,
                    voq["incast_jct_s"], "s", why_not=why_voq),
        Expectation("lossless drops under VOQ", "0 (headroom holds what arrives while "
                    "the pause travels)", "IEEE 802.1Qbb", 0, 0, voq["lossless_drops"],
                    why_not=f"headroom {voq['headroom']}"),
        Expectation("queues held toward other destinations under VOQ", f"0 (the "
                    f"backpressure confined to the feeders of {RECEIVER}'s egress)",
                    VOQ_SOURCE, 0, 0, voq["held_elsewhere"],
                    why_not=f"held destinations {', '.join(voq['held_destinations'])}"),
        Expectation("victim, scheduled", line_formula, SCHEDULED_SOURCE, line, line,
                    sch["victim_mbps"], "Mbit/s", why_not=why_sch),
        Expectation("incast JCT, scheduled", jct_formula, SCHEDULED_SOURCE, jct, jct,
                    sch["incast_jct_s"], "s", why_not=why_sch),
        Expectation("lossless drops, scheduled", "0 (no byte enters without a grant)",
                    SCHEDULED_SOURCE, 0, 0, sch["lossless_drops"], why_not=why_sch),
        Expectation("pause frames, scheduled", "0 (credits, not pauses)", SCHEDULED_SOURCE,
                    0, 0, sch["pause_frames"], why_not=why_sch),
    ]


def plot(folder: Path, rows: dict) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), dpi=110)
    FigureCanvasAgg(fig)
    panels = (("victim_mbps", "victim throughput (Mbit/s)"),
              ("lossless_drops", "lossless-class drops"),
              ("retransmits", "go-back-N retransmissions"))
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        ax.bar([LABELS[m] for m in MODES], [rows[m][key] for m in MODES],
               color=["tab:orange", "tab:blue", "tab:green", "tab:purple"])
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelsize=8, labelrotation=20)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("incast beside a victim flow: PFC off vs on vs VOQ vs scheduled (measured)")
    return save_plot(fig, folder, "pfc_off_vs_on.png")


def reach_cell(r: dict) -> str:
    """The switches that sent an XOFF, and how many."""
    return f"{r['pause_hops']} ({', '.join(r['switches_that_paused']) or '-'})"


def held_cells(r: dict) -> str:
    """Held destinations | held queues toward another destination (VOQ only)."""
    if not r["voq"]:
        return "- (whole class) | -" if r["pause_hops"] else "- | -"
    return f"{', '.join(r['held_destinations']) or 'none'} | {r['held_elsewhere']}"


def finding(rows: dict) -> str:
    on, off, voq = rows["on"], rows["off"], rows["voq"]
    return (f"**Finding:** PFC on: {on['lossless_drops']} lossless drops (off: "
            f"{off['lossless_drops']}); the victim, whose receiver is not congested, got "
            f"{on['victim_mbps']:.1f} Mbit/s with PFC and {off['victim_mbps']:.1f} without "
            + ("(head-of-line blocking: it waits behind the paused incast)"
               if on["victim_mbps"] < off["victim_mbps"] else
               "(no head-of-line loss this run: see the expected vs measured table)")
            + f"; PFC's pauses were sent by {', '.join(on['switches_that_paused']) or 'no switch'}"
            f" (each pauses the hop before it: {on['pause_hops']} switches). With VOQ the "
            f"victim got {voq['victim_mbps']:.1f} Mbit/s, the incast ended in "
            f"{voq['incast_jct_s']:.2f} s (PFC: {on['incast_jct_s']:.2f} s) with "
            f"{voq['lossless_drops']} lossless drops; VOQ pauses were sent by "
            f"{', '.join(voq['switches_that_paused']) or 'no switch'} "
            f"({voq['pause_hops']} switches: the incast still stops at its sources), held "
            f"only the queues toward {', '.join(voq['held_destinations']) or 'no destination'}"
            f" over {', '.join(voq['held_links']) or 'no link'}, and "
            f"{voq['held_elsewhere']} queues toward another destination. The scheduled "
            f"fabric (credits from each egress, no pause) gave the victim "
            f"{rows['scheduled']['victim_mbps']:.1f} Mbit/s and ended the incast in "
            f"{rows['scheduled']['incast_jct_s']:.2f} s with "
            f"{rows['scheduled']['pause_frames']} pause frames and "
            f"{rows['scheduled']['lossless_drops']} lossless drops.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--message-bytes", type=int, default=3_000_000, help="bytes per flow")
    ap.add_argument("--queue-bytes", type=int, default=2 << 20, help="switch port buffer")
    ap.add_argument("--xoff", type=int, default=150_000, help="XOFF threshold (bytes)")
    ap.add_argument("--window", type=int, default=512, help="packets in flight per flow")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    knobs = HolKnobs(message_bytes=args.message_bytes, queue_bytes=args.queue_bytes,
                     xoff_bytes=args.xoff, window_packets=args.window, seed=args.seed)
    folder = new_folder(args.results, "pfc_hol")
    rows = {}
    with marks_failure(folder):
        for mode in MODES:
            rows[mode] = measure(folder, mode, knobs)
    made = plot(folder, rows)
    lines = ["# PFC: loss vs head-of-line blocking, and VOQ", "",
             f"leaf-spine 2 x 4 hosts, one spine, uplinks {UPLINK_MBPS:g} Mbit/s, hosts "
             f"{HOST_MBPS:g} Mbit/s, "
             f"{args.queue_bytes} B port buffers, XOFF {args.xoff} B; incast "
             f"{', '.join(INCAST)} beside the victim {VICTIM}; {args.message_bytes} B per "
             "flow, RoCE go-back-N. VOQ: PFC on, a lossless queue per destination on every "
             "switch-facing port, paused one destination at a time. Scheduled: the same "
             "queues, each sender's sent only at the rate its destination's egress grants "
             "(fabric.scheduled), the NIC's queues per destination, no pause.", "",
             finding(rows), "",
             "Pause hops: the switches that sent an XOFF frame (PFC's, or a VOQ pause of one "
             "destination's queue), the congested one included. Held destinations: the "
             f"destinations whose queues a VOQ pause held; beside them the held queues "
             f"toward a destination other than the incast's receiver {RECEIVER}.",
             "", "| mode | victim (Mbit/s) | incast JCT (s) | lossless drops | pause frames | "
             "paused (s) | pause hops | held destinations | held elsewhere | retransmits | "
             "headroom | reaction p50 (ms) | fidelity |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        r = rows[mode]
        lines.append(f"| {LABELS[mode]} | {r['victim_mbps']:.1f} | {r['incast_jct_s']:.3f} | "
                     f"{r['lossless_drops']} | {r['pause_frames']} | {r['paused_s']} | "
                     f"{reach_cell(r)} | {held_cells(r)} | "
                     f"{r['retransmits']} | {r['headroom']} | {r['reaction_ms_p50']} | "
                     f"{r['fidelity']} |")
    expected = expectations(rows, args.message_bytes)
    lines += expectation_lines(expected)
    lines += ["", "Queue occupancy and pause timelines per port: "
              + ", ".join(f"`{r['folder']}/plots/pfc_*.png`" for r in rows.values())]
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {**rows, "expected": [e.to_dict() for e in expected]},
                         [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
