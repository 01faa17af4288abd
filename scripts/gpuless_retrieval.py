#!/usr/bin/env python3
"""Retrieval RPCs of a GPU-less cluster on a one-tier mesh, a leaf-spine and a
rail-optimized fabric of the same endpoint count, under a load sweep.

Claim: a cluster of CPU nodes wired as a one-tier mesh gives deterministic retrieval and
low-overhead east-west traffic: no switch between a client and a server, so an RPC pays
no switch hop and meets no other pair's traffic on its link. Measured here: the same
retrieval traffic (the first half of the endpoints ask, the second half answer; request
--request-bytes, response --response-bytes) on a full mesh, a non-blocking leaf-spine
and a non-blocking rail-optimized fabric (testbed.gpuless_retrieval), open loop at
--loads fractions of what the servers' links can answer, plus a closed loop per fabric.
Per fabric and load: RPC latency p50/p99/p99.9, RPCs/s, the fabric's switches, links,
cost and power (topologies.physics.cost_table), drops, the fidelity verdict.

    sudo .venv/bin/python scripts/gpuless_retrieval.py [--endpoints 8]
        [--loads 0.2,0.5,0.8] [--closed 2] [--rate 100]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from testbed.benchmarks import machine_line
from testbed.expect import Expectation, expectation_lines
from testbed.gpuless_retrieval import BASE_MBPS, FABRICS, RetrievalKnobs, measure
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit
from testbed.script_args import add_rate

ROOT = Path(__file__).resolve().parent.parent

ALONE_SOURCE = "store-and-forward on an idle fabric (testbed.attribution's alone_s)"
LITTLE_SOURCE = "Little, Operations Research 1961"


def _f(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def expectations(rows: list[dict], knobs: RetrievalKnobs) -> list[Expectation]:
    """Per fabric: the lowest load's p50 against request + response alone, every open-loop
    load's throughput against the requests its seeded plan made (an open loop below the
    servers' bound answers what it is asked: N requests over their span, which for a few
    hundred draws differs from clients x rate by the sample's own spread), the highest
    load's within that bound, and Little's law in the closed loop."""
    out = []
    for fabric in FABRICS:
        mine = [r for r in rows if r["fabric"] == fabric]
        opened = sorted((r for r in mine if r["fraction"] is not None),
                        key=lambda r: r["fraction"])
        why = "fidelity {fidelity}, {drops} drops, {retransmits} retransmits"
        if opened and opened[0]["alone_s"] and opened[0]["p50_s"]:
            r = opened[0]
            out.append(Expectation(
                f"{fabric}: RPC latency p50 at load {r['fraction']:g}", "request alone + "
                "response alone (frames at the slowest link + a frame per hop)",
                ALONE_SOURCE, r["alone_s"], r["alone_s"], r["p50_s"], "s",
                why_not=why.format(**r) + "; above: the agents' own time per RPC (four "
                "steps: request out, served, answered, received); below: each port's "
                "shaper lets a burst of about 1 ms of its rate leave at once "
                "(fabric.shaping.htb_params), which alone_s does not count"))
        for r in opened:
            if r["rpcs_per_s"]:
                n = max(1, r["rpcs_done"])
                out.append(Expectation(
                    f"{fabric}: RPCs/s at load {r['fraction']:g}", "the planned requests "
                    "over their span (open loop, below the servers' bound, every request "
                    "answered: X = arrivals)", "Poisson arrivals (this run's seeded [rpc] "
                    "plan; the rate asked is clients x rate)", r["planned_per_s"],
                    r["planned_per_s"], r["rpcs_per_s"], "/s", tolerance=3 / math.sqrt(n),
                    why_not=why.format(**r) + "; RPCs answered later than asked"))
        if opened and opened[-1]["rpcs_per_s"]:
            r = opened[-1]
            out.append(Expectation(
                f"{fabric}: RPCs/s at load {r['fraction']:g}, at most", "servers x B / "
                "response", "the servers' links carry every response", 0.0,
                knobs.servers_bound_per_s(), r["rpcs_per_s"], "/s",
                why_not="more responses than the servers' links carry"))
        for r in mine:
            if r["fraction"] is None and r["rpcs_per_s"] and r["mean_s"]:
                n = r["clients"] * r["closed"]
                out.append(Expectation(
                    f"{fabric}: RPCs in flight (closed loop)", "Little's law N = X R",
                    LITTLE_SOURCE, n, n, r["rpcs_per_s"] * r["mean_s"], "",
                    why_not="the agents' own time between a response and the next "
                    "request"))
    return out


def finding(rows: list[dict], loads: list[float]) -> str:
    """What the runs show, from the numbers: latency at the lowest and highest load per
    fabric, and what each fabric costs beside the mesh."""
    def at(fabric: str, f: float) -> dict:
        return next(r for r in rows if r["fabric"] == fabric and r["fraction"] == f)
    lo, hi = min(loads), max(loads)
    low = {fab: at(fab, lo)["p50_s"] for fab in FABRICS}
    tail = {fab: at(fab, hi)["p99_s"] for fab in FABRICS}
    cost = {fab: at(fab, lo)["cost_usd"] for fab in FABRICS}
    power = {fab: at(fab, lo)["power_w"] for fab in FABRICS}
    parts = [f"p50 at load {lo:g}: " + ", ".join(f"{fab} {_ms(v)} ms" for fab, v in
                                                   low.items())]
    if hi != lo:
        parts.append(f"p99 at load {hi:g}: " + ", ".join(
            f"{fab} {_ms(v)} ms" for fab, v in tail.items()))
    best = min((f for f in FABRICS if tail[f] is not None), key=tail.get, default=None)
    if best:
        parts.append(f"the lowest p99 at load {hi:g} is {best}'s")
    parts.append("cost " + ", ".join(f"{fab} ${cost[fab]:,.0f} ({power[fab]:,.0f} W)"
                                     for fab in FABRICS))
    unfaithful = [f"{r['fabric']} {r['fraction'] if r['fraction'] is not None else 'closed'}"
                  for r in rows if r["fidelity"] != "faithful"]
    return ("**Finding:** " + "; ".join(parts) + ". One run each: "
            + (f"not faithful ({', '.join(unfaithful)}), so their times include the "
               "emulator's own delays." if unfaithful else "all faithful."))


def table(rows: list[dict]) -> list[str]:
    lines = ["| fabric | switches | links | cost (USD) | power (W) | load | rate per client "
             "(/s) | RPCs/s | p50 (ms) | p99 (ms) | p99.9 (ms) | alone (ms) | drops | "
             "fidelity |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        load = f"{r['fraction']:g}" if r["fraction"] is not None else \
            f"closed, {r['closed']} in flight"
        rate = _f(r["rate_per_client_s"], ".1f") if r["fraction"] is not None else "-"
        lines.append(f"| {r['fabric']} | {r['switches']} | {r['links']} | "
                     f"{r['cost_usd']:,.0f} | {r['power_w']:,.0f} | {load} | {rate} | "
                     f"{_f(r['rpcs_per_s'], '.1f')} | {_ms(r['p50_s'])} | {_ms(r['p99_s'])} | "
                     f"{_ms(r['p999_s'])} | {_ms(r['alone_s'])} | {r['drops']} | "
                     f"{r['fidelity']} |")
    return lines


def plot(folder: Path, rows: list[dict]) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=110)
    FigureCanvasAgg(fig)
    colours = dict(zip(FABRICS, ("tab:green", "tab:blue", "tab:purple"), strict=True))
    ax = fig.add_subplot(1, 2, 1)
    for fab in FABRICS:
        mine = sorted((r for r in rows if r["fabric"] == fab and r["fraction"] is not None
                       and r["p99_s"]), key=lambda r: r["fraction"])
        ax.plot([r["fraction"] for r in mine], [r["p99_s"] * 1e3 for r in mine], marker="o",
                color=colours[fab], label=f"{fab} p99")
        ax.plot([r["fraction"] for r in mine], [r["p50_s"] * 1e3 for r in mine], marker=".",
                ls="--", color=colours[fab], alpha=0.6, label=f"{fab} p50")
    ax.set_xlabel("offered load (fraction of the servers' links)")
    ax.set_ylabel("RPC latency (ms, emulated)")
    ax.set_ylim(bottom=0)
    ax.set_title("retrieval RPC latency vs load", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax = fig.add_subplot(1, 2, 2)
    first = {fab: next(r for r in rows if r["fabric"] == fab) for fab in FABRICS}
    ax.bar(range(len(FABRICS)), [first[f]["cost_usd"] / 1e3 for f in FABRICS],
           color=[colours[f] for f in FABRICS])
    for i, f in enumerate(FABRICS):
        ax.text(i, first[f]["cost_usd"] / 1e3, f"{first[f]['power_w']:,.0f} W",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(FABRICS)), FABRICS)
    ax.set_ylabel("cost (kUSD, real rates)")
    ax.set_title("fabric cost (power above each bar)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("GPU-less retrieval: one-tier mesh vs leaf-spine vs rail-optimized "
                 "(measured)", fontsize=10)
    return save_plot(fig, folder, "gpuless_retrieval.png")


def _loads(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or not all(math.isfinite(v) and 0 < v < 1 for v in values):
        raise ValueError
    return sorted(set(values))


def refusal(args) -> str:
    """What is wrong with the arguments, in one line ("" when nothing is)."""
    if args.endpoints < 4 or args.endpoints % 2:
        return f"--endpoints {args.endpoints}: an even number, at least 4"
    for flag, value in (("--request-bytes", args.request_bytes),
                        ("--response-bytes", args.response_bytes), ("--count", args.count)):
        if value < 1:
            return f"--{flag.lstrip('-')} {value}: must be at least 1"
    if not 0 <= args.closed <= 64:
        return f"--closed {args.closed}: requests in flight per client, 0 (none) to 64"
    try:
        _loads(args.loads)
    except ValueError:
        return f"--loads {args.loads}: comma-separated fractions between 0 and 1 (exclusive)"
    try:
        rate = float(args.rate_mbps)
    except ValueError:
        return f"--rate {args.rate_mbps}: a number of Mbit/s"
    if not (math.isfinite(rate) and rate > 0):
        return f"--rate {args.rate_mbps}: a finite number of Mbit/s above 0"
    return ""


def main(argv=None) -> int:
    knobs = RetrievalKnobs()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=int, default=knobs.endpoints,
                    help="endpoints on every fabric (even; half ask, half answer)")
    ap.add_argument("--loads", default="0.2,0.5,0.8",
                    help="open-loop loads, fractions of what the servers' links answer")
    ap.add_argument("--closed", type=int, default=2,
                    help="a closed-loop run per fabric with this many in flight per client "
                         "(0: none)")
    ap.add_argument("--request-bytes", type=int, default=knobs.request_bytes)
    ap.add_argument("--response-bytes", type=int, default=knobs.response_bytes)
    ap.add_argument("--count", type=int, default=knobs.count, help="requests per client")
    add_rate(ap, default=f"{BASE_MBPS:g}", help="endpoint link rate in Mbit/s (default "
             f"{BASE_MBPS:g}; a fixed number, since the loads are fractions of it)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    bad = refusal(args)
    if bad:
        print(f"gpuless_retrieval: {bad}", file=sys.stderr)
        return 2
    loads = _loads(args.loads)
    knobs = RetrievalKnobs(endpoints=args.endpoints, request_bytes=args.request_bytes,
                           response_bytes=args.response_bytes, count=args.count,
                           rate_mbps=float(args.rate_mbps), seed=args.seed)
    folder = new_folder(args.results, "gpuless_retrieval")
    rows: list[dict] = []
    with marks_failure(folder):
        for fabric in FABRICS:
            rows += [measure(folder, fabric, f, 0, knobs) for f in loads]
            if args.closed:
                rows.append(measure(folder, fabric, None, args.closed, knobs))
    made = plot(folder, rows)
    lines = ["# GPU-less retrieval: one-tier mesh vs leaf-spine vs rail-optimized", "",
             f"{knobs.endpoints} endpoints on each fabric at {knobs.rate_mbps:g} Mbit/s: "
             f"{knobs.endpoints - knobs.servers} clients ask, {knobs.servers} servers "
             f"answer; request {knobs.request_bytes} B, response {knobs.response_bytes} B, "
             f"{knobs.count} requests per client; open loop at "
             f"{', '.join(f'{f:g}' for f in loads)} of the servers' bound "
             f"({knobs.servers_bound_per_s():.0f} responses/s: servers x B / response)"
             + (f", and a closed loop of {args.closed} in flight per client" if args.closed
                else "") + f"; seed {knobs.seed}; {machine_line()}.", "",
             finding(rows, loads), "",
             "Latency: the client's view, its request's first packet to its response's "
             "last (emulated time). Alone: request + response each alone on the empty "
             "fabric. Cost and power: the fabric's switches and links at the real rates "
             "(topologies.physics.cost_table). The leaf-spine's uplinks and the "
             "rail-optimized fabric's are sized for their hosts (non-blocking); the full "
             "mesh gives every pair its own link.", "", *table(rows)]
    expected = expectations(rows, knobs)
    lines += expectation_lines(expected)
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {"runs": rows,
                                        "expected": [e.to_dict() for e in expected]}, [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
