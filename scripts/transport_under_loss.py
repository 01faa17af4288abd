#!/usr/bin/env python3
"""RoCE go-back-N vs UET-style selective recovery under loss (claim 3).

Claim: RoCE's go-back-N collapses under loss; a UET-style transport does not.

Elephant flows across a leaf-spine (every host of leaf 0 sends to its twin on leaf 1)
with random loss on every fabric link (netem where the kernel has it, else nftables
`numgen random`), for each loss rate, transport (roce, uet) and entropy mode (ecmp,
spray). Reports goodput (delivered bytes / job time) and JCT against loss, with the
retransmissions each transport needed. One folder with every run inside, plots and
summary.md.

    sudo .venv/bin/python scripts/transport_under_loss.py [--loss 0 0.002 0.01 0.03]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.expect import GBN_SOURCE, Expectation, expectation_lines
from testbed.experiment import finite_float, from_toml
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit
from testbed.run import run
from topologies.link_settings import DELAY_MODES

ROOT = Path(__file__).resolve().parent.parent

COMBOS = (("roce", "ecmp"), ("roce", "spray"), ("uet", "ecmp"), ("uet", "spray"))
HOPS = 4      # links a packet crosses: host uplink, leaf-spine, spine-leaf, host downlink


def measure(base: Path, args, loss: float, transport: str, entropy: str) -> dict:
    hosts = args.hosts
    exp = from_toml(None, {
        "name": f"{transport}_{entropy}_loss{loss:g}".replace(".", "p"), "workload": "p2p",
        "pairs": [f"l0h{i}>l1h{i}" for i in range(hosts)],
        "message_bytes": args.message_bytes, "iterations": args.iterations,
        "transport": transport, "entropy": entropy, "seed": args.seed, "loss_rate": loss,
        "delay": args.delay,
        "results_dir": str(base), "timeout_s": 300.0, "rto_ms": args.rto_ms,
        "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
            "leaves": 2, "spines": args.spines, "hosts_per_leaf": hosts}}})
    print(f"== loss {loss:g}: {transport}, {entropy}", flush=True)
    _, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    jct = m["jct_mean_s"]
    goodput = m["flows"]["bytes_delivered"] / args.iterations * 8 / jct / 1e6 / hosts
    return {"loss": loss, "transport": transport, "entropy": entropy, "jct_s": jct,
            "ideal_s": m["ideal_s"], "window_packets": exp.window_packets,
            "goodput_mbps_per_flow": goodput, "retransmits": m["flows"]["retransmits"],
            "naks": m["flows"]["naks"], "timeouts": m["flows"]["timeouts"],
            "exactly_once": m["flows"]["exactly_once"],
            "mechanism": (m["link_physics"] or {}).get("mechanisms", {}).get("loss", "none"),
            "fidelity": m["fidelity"]["verdict"]}


def expectations(rows: list[dict], rto_ms: float, flows: int) -> list[Expectation]:
    """Each lossy run's JCT against ARQ theory. A packet crosses HOPS links, each
    dropping p, so it is lost with P = 1 - (1 - p)^HOPS. Selective repeat resends only
    what was lost: JCT = ideal / (1 - P). Go-back-N resends up to a window W per loss:
    JCT = ideal (1 + (W - 1) P) / (1 - P) when every loss costs a whole window, so a
    RoCE run should land between the two. Neither counts the RTOs that recover losses
    no later packet reveals (at the tail of a message), nor the NAKs that reordering
    alone causes when go-back-N meets spraying: the reasons given when a run is slower
    than the theory says. `flows` run at once, so their RTOs overlap."""
    out = []
    for r in rows:
        if r["loss"] <= 0:
            continue
        p_path = 1 - (1 - r["loss"]) ** HOPS
        sr = r["ideal_s"] / (1 - p_path)
        gbn = r["ideal_s"] * (1 + (r["window_packets"] - 1) * p_path) / (1 - p_path)
        rto_s = r["timeouts"] / flows * rto_ms / 1e3
        why = (f"{r['timeouts']} RTOs over {flows} concurrent flows, about {rto_s:.3f} s "
               "of recovery per flow that the formula leaves out")
        if r["transport"] == "roce" and r["entropy"] == "spray":
            why += f"; {r['naks']} NAKs: spraying reorders and go-back-N resends on each"
        name = f"{r['transport']} {r['entropy']} JCT at {r['loss'] * 100:g}% per link"
        if r["transport"] == "uet":
            out.append(Expectation(name, f"selective repeat: ideal / (1-P), P = 1-(1-p)^{HOPS} "
                                   f"= {p_path:.3f}", GBN_SOURCE, sr, sr, r["jct_s"], "s",
                                   why_not=why))
        else:
            out.append(Expectation(name, "between selective repeat ideal/(1-P) and go-back-N "
                                   f"ideal(1+(W-1)P)/(1-P), W = {r['window_packets']}, "
                                   f"P = {p_path:.3f}", GBN_SOURCE, sr, gbn, r["jct_s"], "s",
                                   why_not=why))
    return out


def plot(folder: Path, rows: list[dict], link_mbps: float) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for transport, entropy in COMBOS:
        pts = sorted((r["loss"] * 100, r) for r in rows
                     if (r["transport"], r["entropy"]) == (transport, entropy))
        xs = [x for x, _ in pts]
        style = "-" if transport == "uet" else "--"
        ax1.plot(xs, [r["goodput_mbps_per_flow"] for _, r in pts], "o" + style,
                 label=f"{transport}, {entropy}")
        ax2.plot(xs, [r["jct_s"] for _, r in pts], "o" + style, label=f"{transport}, {entropy}")
    ax1.axhline(link_mbps, color="grey", lw=1, ls=":", label="link rate")
    ax1.set_xlabel("random loss on every link (%)")
    ax1.set_ylabel("goodput per flow (Mbit/s, measured)")
    ax1.set_title("goodput vs loss")
    ax2.set_xlabel("random loss on every link (%)")
    ax2.set_ylabel("job completion time (s, measured)")
    ax2.set_title("JCT vs loss")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save_plot(fig, folder, "goodput_jct_vs_loss.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loss", type=finite_float, nargs="+", default=[0.0, 0.002, 0.01, 0.03],
                    help="loss rates (fractions) on every fabric link")
    ap.add_argument("--hosts", type=int, default=2, help="hosts per leaf (= flows)")
    ap.add_argument("--spines", type=int, default=2)
    ap.add_argument("--message-bytes", type=int, default=2 << 20)
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--rto-ms", type=finite_float, default=50.0)
    ap.add_argument("--delay", choices=DELAY_MODES, default="off",
                    help="each link's propagation delay (scaled): the round trip a NAK "
                    "takes, during which go-back-N keeps sending what it must resend")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    if any(not 0 <= x < 1 for x in args.loss):
        ap.error("--loss: every rate must be a fraction in [0, 1)")
    folder = new_folder(args.results, "transport_under_loss")
    rows = []
    with marks_failure(folder):
        for loss in sorted(args.loss):
            for transport, entropy in COMBOS:
                rows.append(measure(folder, args, loss, transport, entropy))
    made = plot(folder, rows, 100.0)
    worst = max(args.loss)

    def at(loss, transport, entropy):
        return next(r for r in rows if (r["loss"], r["transport"], r["entropy"])
                    == (loss, transport, entropy))

    roce, uet = at(worst, "roce", "ecmp"), at(worst, "uet", "ecmp")
    lines = ["# Transport under loss: RoCE go-back-N vs UET-style selective recovery", "",
             f"leaf-spine, {args.hosts} elephant flows of {args.message_bytes} B across "
             f"{args.spines} spines, loss on every link by {rows[-1]['mechanism']}, "
             f"RTO {args.rto_ms:g} ms, propagation delay {args.delay}, seed {args.seed}.",
             "",
             f"**Finding:** at {worst * 100:g}% loss, RoCE (go-back-N, ECMP) delivered "
             f"{roce['goodput_mbps_per_flow']:.1f} Mbit/s per flow with {roce['retransmits']} "
             f"retransmissions; the UET-style transport {uet['goodput_mbps_per_flow']:.1f} "
             f"Mbit/s with {uet['retransmits']}; JCT {roce['jct_s']:.3f} s vs "
             f"{uet['jct_s']:.3f} s.", "",
             "| loss % | transport | entropy | JCT (s) | goodput / flow (Mbit/s) | "
             "retransmits | NAKs | timeouts | exactly once | fidelity |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['loss'] * 100:g} | {r['transport']} | {r['entropy']} | "
                     f"{r['jct_s']:.3f} | {r['goodput_mbps_per_flow']:.1f} | {r['retransmits']} | "
                     f"{r['naks']} | {r['timeouts']} | {'yes' if r['exactly_once'] else 'NO'} | "
                     f"{r['fidelity']} |")
    expected = expectations(rows, args.rto_ms, args.hosts)
    lines += expectation_lines(expected)
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {"runs": rows,
                                        "expected": [e.to_dict() for e in expected]}, [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
