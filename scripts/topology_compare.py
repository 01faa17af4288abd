#!/usr/bin/env python3
"""Rail-optimized vs rail-only vs 1-tier mesh vs leaf-spine on the same endpoints (claim 4).

Claim: rail-only removes the spine at a small cost to all-to-all (Wang et al. 2023:
8.2-11.2% all-to-all completion overhead; network cost -38 to -77%, power -37 to -75%);
a 1-tier mesh removes tiers altogether.

The same number of endpoints (servers x GPUs), each with one fabric port at the same
rate, on four fabrics: rail-optimized (non-blocking spines), rail-only (PXN through the
NVLink domain), one-tier (one non-blocking switch plane) and leaf-spine (non-blocking
uplinks). Each runs a ring all-reduce and an all-to-all with the UET-style transport
and spraying (so ECMP collisions do not confound the topologies), and a window of 16
packets (64 KiB): under PXN a flow's first hop (NVLink, 9x the rail rate) is faster
than its bottleneck, so a larger window than the 128 KiB port queue would only measure
drops. `--cc nscc` adds congestion control: ECN marks at every switch and transit GPU,
and each flow's window reacts (traffic/nscc.py, target 1 us real by default). Reports JCT and busbw
per fabric, the measured rail-only all-to-all overhead beside the published range, and
the static cost/power table of each fabric (topologies/physics.py profiles).

The emulated fabric is too small for the published cost and power cuts, so those are
compared with the same cost model applied to rail-optimized and rail-only specs at a
real size (topologies/at_scale.py: 1,024 GPUs, 8 per server, 51.2 Tb/s switches),
computed from the specs, not emulated; power is modelled, never measured.

    sudo .venv/bin/python scripts/topology_compare.py [--server-count 4 --gpus 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fabric.lossless import ETH_HEADER_BYTES, LOSSLESS_MTU_BYTES
from fabric.switch_ports import assumed_reaction_ms, fan_in, ingress_thresholds
from testbed.expect import Expectation, expectation_lines, ring_allreduce
from testbed.experiment import from_toml, positive_float, rate_arg
from testbed.fidelity import worst_verdict
from testbed.rate import rescaled
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit
from testbed.run import run, script_rate
from testbed.script_args import add_rate, add_server_count
from topologies.at_scale import AT_SCALE_GPUS, cut_percent, rail_only_cut
from topologies.physics import (
    POWER_SOURCE,
    cost_table,
    format_cost_table,
    load_profiles,
)
from topologies.spec import DEFAULT_QUEUE_BYTES, DEFAULT_RATE_MBPS
from topologies.units import rate_text

ROOT = Path(__file__).resolve().parent.parent

PUBLISHED_RAIL_ONLY_A2A_OVERHEAD = (8.2, 11.2)  # percent, Wang et al. 2023
PUBLISHED_COST_CUT = (38, 77)                   # percent, Wang et al. 2023
PUBLISHED_POWER_CUT = (37, 75)                  # percent, Wang et al. 2023
WORKLOADS = ("allreduce", "alltoall")
XOFF_FRAMES = 4         # with PFC, each switch ingress pauses 4 frames above its headroom
REACTION_MARGIN = 4.0   # the headroom covers 4x the controller's assumed reaction


def fabrics(servers: int, gpus: int) -> dict[str, dict]:
    """The four fabrics at the builders' own rates (rails 100 Mbit/s, NVLink 900: the real
    400 Gb/s and 3.6 Tb/s at x4000); each run's `rate` rescales all of a fabric's links by
    one factor (testbed.rate.rescaled), so NVLink stays 9x the rails at any rate."""
    n = servers * gpus
    return {
        "rail_optimized": {"kind": "rail_optimized", "params": {
            "servers": servers, "gpus_per_server": gpus, "spines": 2}},
        "rail_only": {"kind": "rail_only", "params": {
            "servers": servers, "gpus_per_server": gpus}},
        "one_tier": {"kind": "one_tier", "params": {"nodes": n, "planes": 1}},
        "leaf_spine": {"kind": "leaf_spine", "params": {
            "leaves": servers, "spines": 2, "hosts_per_leaf": gpus,
            "uplink_rate_mbps": DEFAULT_RATE_MBPS * gpus / 2}},
    }


def lossless_sizing(exp) -> tuple[int, int]:
    """(the per-port buffer, the PFC headroom) for `exp`'s fabric at the run's rate. The
    headroom covers REACTION_MARGIN x the controller's assumed reaction on the fastest
    port (an all-to-all loads the machine, and the controller reacted in up to 2.35 ms
    against the 1.78 it assumes: rail-only's NVLink transit lost 755-1,206 lossless
    packets to it); the buffer lets every switch ingress hold XOFF_FRAMES frames above
    that headroom (fabric.switch_ports: fan-in x (XOFF + headroom)), or is the builders'
    default if that is larger. A real switch's shared buffer holds every lossless port's
    headroom; the default 128 KiB did not (a one-tier switch of 16 ports needs 271 kB at
    25 Mbit/s)."""
    topo = rescaled(exp.resolve_topology(), float(exp.rate))
    settings = exp.switch_settings()
    reaction_ms = REACTION_MARGIN * assumed_reaction_ms(settings.pfc_poll_ms)
    frame = LOSSLESS_MTU_BYTES + ETH_HEADER_BYTES
    room = max(ingress_thresholds(topo, s, peer, settings, reaction_ms).headroom_bytes
               for s in topo.switches() for peer in topo.ports(s))
    need = max([DEFAULT_QUEUE_BYTES] + [fan_in(topo, s) * (XOFF_FRAMES * frame + room)
                                        for s in topo.switches()])
    return need, room


def experiments(args, rate_mbps: float, folder: Path) -> list:
    """Every run of the comparison: each fabric, each workload, at `rate_mbps`; with PFC,
    each fabric's buffers sized for its lossless headroom (lossless_sizing)."""
    def one(name: str, spec: dict, workload: str, headroom: int = 0):
        return from_toml(None, {
            "name": f"{name}_{workload}", "workload": workload,
            "message_bytes": args.message_bytes, "iterations": args.iterations,
            "transport": "uet", "entropy": "spray", "seed": args.seed,
            "results_dir": str(folder), "timeout_s": 300.0, "rto_ms": 200.0,
            "window_packets": args.window, "topology": {"name": name, **spec},
            "rate": rate_mbps,
            **({"pfc": "on", "pfc_headroom_bytes": headroom} if args.pfc == "on" else {}),
            **({"cc": "nscc", "ecn": "on", "nscc_target_qdelay_us": args.nscc_target_us}
               if args.cc == "nscc" else {})})

    out = []
    for name, spec in fabrics(args.servers, args.gpus).items():
        headroom = 0
        if args.pfc == "on":
            buffer, headroom = lossless_sizing(one(name, spec, WORKLOADS[0]))
            spec = {**spec, "params": {**spec["params"], "queue_bytes": buffer}}
        out += [one(name, spec, workload, headroom) for workload in WORKLOADS]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_count(ap)
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per server")
    add_rate(ap, type=rate_arg, default="auto", metavar="MBPS|auto",
             help="endpoint link rate; auto (default): the highest at which every run "
             "should stay faithful on this machine (its calibration, measured first "
             "if none is cached: 'testbed calibrate'), one for all")
    ap.add_argument("--message-bytes", type=int, default=1 << 20)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--window", type=int, default=16, help="transport window (packets)")
    ap.add_argument("--pfc", choices=["on", "none"], default="on",
                    help="a lossless class paused by PFC on every forwarding node (the "
                    "rail-only transit GPUs too), as AI fabrics run; none: drop-tail")
    ap.add_argument("--cc", choices=["none", "nscc"], default="none",
                    help="congestion control of the UET-style transport: nscc (ECN marks at "
                    "every switch and transit GPU, each flow's window reacts; needs --pfc "
                    "on) or none")
    ap.add_argument("--nscc-target-us", type=positive_float, default=1.0,
                    help="NSCC's target queuing delay in real us (x the scale factor: 1 us "
                    "is 4 ms at x4000, inside a 128 KiB queue)")
    ap.add_argument("--at-scale-gpus", type=int, default=AT_SCALE_GPUS,
                    help="cluster size whose computed cost/power cut is compared with the "
                    "published ranges (8 GPUs per server, 51.2 Tb/s switches)")
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    if args.servers < 2 or args.gpus < 2:
        ap.error("--server-count and --gpus must be at least 2")
    if args.cc == "nscc" and args.pfc != "on":
        ap.error("--cc nscc needs --pfc on (the switches mark CE in the lossless class)")
    profiles = load_profiles()
    at_scale = rail_only_cut(args.at_scale_gpus, profiles)   # SpecError before any run
    args.rate_mbps = script_rate(args.rate_mbps,
                                 lambda rate: experiments(args, rate, Path(args.results)))
    folder = new_folder(args.results, "topology_compare")
    results: dict = {}
    tables: dict = {}
    with marks_failure(folder):
        runs = experiments(args, args.rate_mbps, folder)
        buffers = {e.topology["name"]: e.topology["params"].get("queue_bytes") for e in runs}
        for exp in runs:
            name, workload = exp.topology["name"], exp.workload
            print(f"== {name}: {workload}", flush=True)
            _, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
            results[name, workload] = m
            tables[name] = cost_table(exp.resolve_topology(), profiles)
    names = list(tables)
    a2a_opt = results["rail_optimized", "alltoall"]["jct_mean_s"]
    a2a_ro = results["rail_only", "alltoall"]["jct_mean_s"]
    overhead = 100 * (a2a_ro / a2a_opt - 1)
    cost_cut = cut_percent(tables, "cost_usd")
    power_cut = cut_percent(tables, "power_w")
    lo, hi = PUBLISHED_RAIL_ONLY_A2A_OVERHEAD
    endpoints = args.servers * args.gpus
    gpus = at_scale["gpus"]
    size = (f"{gpus} GPUs ({gpus // at_scale['gpus_per_server']} servers x "
            f"{at_scale['gpus_per_server']}, {rate_text(at_scale['switch_gbps'] * 1000)} "
            f"switches of {at_scale['radix']} ports at the GPU link rate)")
    lines = ["# Topology comparison", "",
             f"{endpoints} endpoints at {args.rate_mbps:g} Mbit/s each; "
             f"{args.message_bytes} B per rank, {args.iterations} iterations, UET-style "
             f"transport with spraying, window {args.window} packets, congestion control "
             f"{args.cc}, seed {args.seed}.", "",
             f"**Finding:** rail-only all-to-all took {overhead:+.1f}% vs rail-optimized "
             f"(published: +{lo}% to +{hi}%). Network cost and power, computed from the "
             f"specs at {size}: rail-only has {at_scale['cost_cut_percent']:.0f}% less cost "
             f"and {at_scale['power_cut_percent']:.0f}% less power (published: "
             f"-{PUBLISHED_COST_CUT[0]} to -{PUBLISHED_COST_CUT[1]}% and "
             f"-{PUBLISHED_POWER_CUT[0]} to -{PUBLISHED_POWER_CUT[1]}%); on the emulated "
             f"{endpoints}-endpoint fabric, {cost_cut:.0f}% less cost and {power_cut:.0f}% "
             f"less power. Link power is {POWER_SOURCE}; switch power and all prices are "
             "assumptions of topologies/link_profiles.toml; none of it is measured.", "",
             "| fabric | all-reduce JCT (s) | all-reduce busbw / link | all-to-all JCT (s) | "
             "all-to-all busbw / link | fabric drops | network power (W) | "
             "network cost (USD) | fidelity |", "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        ar, a2a = results[name, "allreduce"], results[name, "alltoall"]
        verdict = worst_verdict([ar, a2a])
        lines.append(f"| {name} | {ar['jct_mean_s']:.3f} | {ar['busbw_over_link']:.3f} | "
                     f"{a2a['jct_mean_s']:.3f} | {a2a['busbw_over_link']:.3f} | "
                     f"{ar['links']['drops'] + a2a['links']['drops']} | "
                     f"{tables[name]['power_w']:.0f} | {tables[name]['cost_usd']:.0f} | "
                     f"{verdict} |")
    ro_drops = sum(results["rail_only", w]["links"]["drops"] for w in WORKLOADS)
    ro = [results["rail_only", w] for w in WORKLOADS]
    if args.pfc == "on":
        lines += ["", "PFC ran on every forwarding node, the rail-only transit GPUs included, "
                  "so PXN transit is back-pressured as NVLink credits back-pressure it on a "
                  "real server. Each fabric's per-port buffer holds every switch ingress's "
                  f"XOFF ({XOFF_FRAMES} frames) plus the headroom the controller's reaction "
                  "needs at the run's rates, as a real switch's shared buffer does: "
                  + ", ".join(f"{n} {b / 1024:.0f} KiB" for n, b in buffers.items()) + "."]
    if ro_drops:
        lines += ["", f"Rail-only dropped {ro_drops} packets: under PXN a flow's first hop "
                  "(NVLink) is much faster than the rail it then crosses, "
                  + ("and no congestion control ran, " if args.cc == "none" else
                     f"faster than {args.cc}'s window reacts, ")
                  + "so the transit GPU's rail port overflows and retransmissions set the "
                  "pace. Real rail-only fabrics rely on a lossless class or congestion "
                  "control here."]
    src = "Wang et al., How to Build Low-cost Networks for LLMs, arXiv:2307.12169 (2023)"
    model = (f"computed at {gpus} GPUs with this testbed's assumed prices and power "
             "(topologies/link_profiles.toml), not the paper's sizes and prices")
    expected = [
        Expectation("rail-only all-to-all overhead", "published range (PXN through NVLink)",
                    src, lo, hi, overhead, "%", tolerance=0.0,
                    why_not=(f"rail-only fidelity {worst_verdict(ro)} (wire starved up to "
                             f"{max(m['fidelity']['figures']['starved_fraction'] for m in ro):.0%}"
                             " of busy time): the emulator, not PXN, may set this figure"
                             if args.pfc == "on" else
                             f"PXN transit here is IP forwarding into a drop-tail queue with "
                             f"no back-pressure ({ro_drops} drops in rail-only); real PXN is "
                             "flow-controlled (NVLink credits, NCCL FIFOs); run with --pfc on")),
        Expectation(f"rail-only network cost cut at {gpus} GPUs (computed)",
                    "1 - rail-only / rail-optimized, cost_table of the specs at that size",
                    src, *PUBLISHED_COST_CUT, at_scale["cost_cut_percent"], "%",
                    tolerance=0.0, why_not=model),
        Expectation(f"rail-only network power cut at {gpus} GPUs (computed, power "
                    "modelled)", "1 - rail-only / rail-optimized, cost_table of the specs "
                    "at that size", src, *PUBLISHED_POWER_CUT, at_scale["power_cut_percent"],
                    "%", tolerance=0.0, why_not=model)]
    for name in names:
        ar = results[name, "allreduce"]
        expected.append(ring_allreduce(
            f"{name} ring all-reduce JCT", ar["ideal_s"], ar["jct_mean_s"],
            why_not=f"{ar['links']['drops']} drops, {ar['flows']['retransmits']} retransmits, "
                    f"fidelity {ar['fidelity']['verdict']}"))
    lines += expectation_lines(expected)
    lines += ["", f"Cost and power of the emulated {endpoints}-endpoint fabrics:", "", "```"]
    lines += [format_cost_table(tables[name]).rstrip() for name in names] + ["```"]
    lines += ["", f"Cost and power at {size}, computed from the specs (not emulated):", "",
              "```"]
    lines += [format_cost_table(t).rstrip() for t in at_scale["tables"].values()] + ["```"]
    text = "\n".join(lines) + "\n"
    metrics = {
        "rail_only_alltoall_overhead_percent": overhead,
        "published_overhead_percent": list(PUBLISHED_RAIL_ONLY_A2A_OVERHEAD),
        "rail_only_cost_cut_percent": cost_cut, "rail_only_power_cut_percent": power_cut,
        "rail_only_cost_cut_percent_at_scale": at_scale["cost_cut_percent"],
        "rail_only_power_cut_percent_at_scale": at_scale["power_cut_percent"],
        "published_cost_cut_percent": list(PUBLISHED_COST_CUT),
        "published_power_cut_percent": list(PUBLISHED_POWER_CUT),
        "at_scale": {"gpus": gpus, "gpus_per_server": at_scale["gpus_per_server"],
                     "switch_gbps": at_scale["switch_gbps"], "radix": at_scale["radix"],
                     "power_source": POWER_SOURCE, "cost": at_scale["tables"]},
        "runs": {f"{n}.{w}": {"jct_mean_s": m["jct_mean_s"],
                              "busbw_over_link": m["busbw_over_link"],
                              "fidelity": m["fidelity"]["verdict"]}
                 for (n, w), m in results.items()},
        "cost": tables, "expected": [e.to_dict() for e in expected]}
    return finish_script(folder, text, metrics, [plot(folder, names, results)])


def plot(folder: Path, names: list[str], results: dict) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.38
    for j, workload in enumerate(WORKLOADS):
        ax.bar([i + (j - 0.5) * width for i in range(len(names))],
               [results[n, workload]["jct_mean_s"] for n in names], width, label=workload)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("JCT (s, measured, mean of iterations)")
    ax.set_title("the same job on four fabrics")
    ax.legend()
    return save_plot(fig, folder, "jct_per_topology.png")


if __name__ == "__main__":
    sys.exit(script_exit(main))
