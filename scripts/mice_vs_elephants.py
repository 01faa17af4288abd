#!/usr/bin/env python3
"""Mice and elephants on a leaf-spine under ECMP, DLB and packet spraying, and the mixed
traffic under PFC, DCQCN and NSCC.

Claim: static routing was designed for mice, not elephants. Per-flow hashing (ECMP) spreads
many small flows well enough, since no one of them holds a path for long; a few long
elephants that hash onto one uplink share it for their whole life while another sits
idle. Measured here: the mice alone, the elephants alone, and both together, each under
ECMP, switch DLB (per flowlet) and per-packet spraying, plus the mixed traffic under
PFC, DCQCN and NSCC on ECMP (testbed.mice_elephants).

Mice: open-loop flows at Poisson instants (workload flows) at --load of each host's
link, sizes from --sizes (default fb_hadoop: most flows are under a kilobyte and a few
carry megabytes, the mix the claim is about; google_rpc's mean of 2.9 kB would ask
about 860 flows/s per host at load 0.2, more than the agents start on time on a small
machine). Elephants: every host sends --message-bytes to a permutation peer from the
start. Per run: the mice's slowdown (FCT / time alone) p50 and p99 in the smallest size
bucket and over every flow, and over the flows that arrived while the elephants ran;
the elephants' JCT over S / B and over the max-min model of their paths; drops; the
fidelity verdict.

    sudo .venv/bin/python scripts/mice_vs_elephants.py [--modes ecmp,dlb,spray]
        [--controls pfc,dcqcn,nscc] [--rate 100] [--message-bytes 2097152]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from testbed.benchmarks import machine_line
from testbed.expect import Expectation, expectation_lines
from testbed.experiment import rate_arg
from testbed.mice_elephants import CONTROLS, MIXES, MODES, SIZES, MixKnobs, measure
from testbed.results import finish_script, marks_failure, new_folder, save_plot, script_exit
from testbed.script_args import add_rate, rate_flag_error
from topologies.spec import SpecError
from traffic.flow_sizes import load as load_sizes

ROOT = Path(__file__).resolve().parent.parent

PS_SOURCE = "M/G/1 processor sharing (Kleinrock, Queueing Systems vol. 2, 1976)"
COLLISION_SOURCE = ("ECMP's hash collisions: max-min on the hashed paths "
                    "(testbed.attribution.collision_model_s; Al-Fares et al., NSDI 2010)")
SPRAY_SOURCE = ("packet spraying splits every flow evenly over its paths (Dixit et al., "
                "INFOCOM 2013): max-min on that split")


def key(mix: str, mode: str) -> str:
    return f"{mix}/{mode}"


def _f(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def expectations(rows: dict, modes: list[str]) -> list[Expectation]:
    """The mice alone against M/G/1-PS; the elephants alone against the max-min model of
    their paths: hashed under ECMP, split evenly under spraying."""
    out = []
    for mode in modes:
        r = rows[key("mice", mode)]
        mice = r["mice"]
        if mice["mean"] is not None:
            out.append(Expectation(
                f"mice alone, mean slowdown, {mode}", "M/G/1-PS: 1 / (1 - rho), every size",
                PS_SOURCE, mice["ps_slowdown"], mice["ps_slowdown"], mice["mean"], "x",
                why_not=f"fidelity {r['fidelity']}; the agents' own time per flow weighs on "
                "the smallest flows, and each receiver's link is a second queue"))
    for mode, formula, source in (
            ("ecmp", "max-min on the hashed paths, all starting together", COLLISION_SOURCE),
            ("spray", "max-min with each flow split evenly over its paths (S / B when the "
             "uplinks carry the load)", SPRAY_SOURCE)):
        r = rows.get(key("elephants", mode))
        if r and r["model_s"] and r["elephants_s"]:
            out.append(Expectation(
                f"elephants alone, JCT, {mode}", formula, source, r["model_s"], r["model_s"],
                r["elephants_s"], "s", why_not=f"fidelity {r['fidelity']}, {r['drops']} "
                f"drops, {r['retransmits']} retransmits"))
    return out


def finding(rows: dict, modes: list[str], controls: list[str]) -> str:
    """Where ECMP does well and where it does not, and what the elephants do to the
    mice's tail, from the numbers measured."""
    parts = []
    alone = {m: rows[key("mice", m)]["mice"]["all_p99"] for m in modes}
    if all(v is not None for v in alone.values()):
        spread = max(alone.values()) / min(alone.values()) - 1
        parts.append("mice alone: p99 slowdown " + ", ".join(
            f"{m} {v:.2f}" for m, v in alone.items())
            + (f" (the modes differ by {spread:.0%})" if len(modes) > 1 else ""))
    eleph = {m: rows[key("elephants", m)]["elephants_over_ideal"] for m in modes}
    if all(v is not None for v in eleph.values()):
        text = "elephants alone: JCT / ideal " + ", ".join(
            f"{m} {v:.2f}" for m, v in eleph.items())
        if "ecmp" in eleph and len(eleph) > 1:
            best = min(eleph, key=eleph.get)
            text += (f"; ECMP takes {eleph['ecmp'] / eleph[best]:.2f}x the time of the "
                     f"best ({best})")
        parts.append(text)
    cells = []
    for m in modes:
        a = rows[key("mice", m)]["mice"]
        b = rows[key("both", m)]["mice"]
        if a["all_p99"] and b["all_p99"]:
            cells.append(f"{m} {a['all_p99']:.2f} -> {b['all_p99']:.2f} "
                         f"({b['all_p99'] / a['all_p99']:.1f}x; "
                         f"{_f(b['during_p99'])} over the {b['during_flows']} that arrived "
                         "while the elephants ran)")
    if cells:
        parts.append("beside the elephants the mice's p99 slowdown goes " + ", ".join(cells))
    ctl = [f"{c} {_f(rows[key('both', c)]['mice']['all_p99'])} (elephants "
           f"{_f(rows[key('both', c)]['elephants_over_ideal'])}x ideal)" for c in controls]
    if ctl:
        parts.append("the mixed traffic's mice p99 on ECMP with " + ", ".join(ctl))
    unfaithful = [k for k, r in rows.items() if r["fidelity"] != "faithful"]
    return ("**Finding:** " + "; ".join(parts) + ". One run each: "
            + (f"not faithful ({', '.join(unfaithful)}), so their times include the "
               "emulator's own delays." if unfaithful else "all faithful."))


def table(rows: dict) -> list[str]:
    lines = ["| mix | mode | mice: small p50 | small p99 | all p50 | all p99 | p99 while "
             "elephants ran (flows) | elephants JCT (s) | JCT / ideal | model / ideal | "
             "drops | fidelity |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.values():
        m = r["mice"] or {}
        during = (f"{_f(m.get('during_p99'))} ({m['during_flows']})"
                  if r["mix"] == "both" else "-")
        model = r["model_s"] / r["ideal_s"] if r["model_s"] else None
        lines.append(f"| {r['mix']} | {r['mode']} | {_f(m.get('small_p50'))} | "
                     f"{_f(m.get('small_p99'))} | {_f(m.get('all_p50'))} | "
                     f"{_f(m.get('all_p99'))} | {during} | {_f(r['elephants_s'], '.3f')} | "
                     f"{_f(r['elephants_over_ideal'])} | {_f(model)} | {r['drops']} | "
                     f"{r['fidelity']} |")
    return lines


def plot(folder: Path, rows: dict, modes: list[str], controls: list[str]) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=110)
    FigureCanvasAgg(fig)
    names = modes + controls
    width = 0.38
    ax = fig.add_subplot(1, 2, 1)
    for k, (mix, label, colour) in enumerate((("mice", "mice alone", "tab:blue"),
                                              ("both", "beside the elephants", "tab:red"))):
        xs = [i + (k - 0.5) * width for i, n in enumerate(names) if key(mix, n) in rows]
        ys = [rows[key(mix, n)]["mice"]["all_p99"] or 0 for n in names if key(mix, n) in rows]
        ax.bar(xs, ys, width, label=label, color=colour)
    ps = rows[key("mice", modes[0])]["mice"]["ps_slowdown"]
    ax.axhline(ps, color="black", lw=0.8, ls="--", label=f"M/G/1-PS 1/(1-rho) = {ps:.2f}")
    ax.set_yscale("log")
    tallest = max((r["mice"]["all_p99"] or 1 for r in rows.values() if r["mice"]), default=1)
    ax.set_ylim(top=max(tallest, ps) * 10)            # room for the legend above the bars
    ax.set_xticks(range(len(names)), names)
    ax.set_title("mice: p99 slowdown (FCT / alone, log scale)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 2, 2)
    for k, (mix, label, colour) in enumerate((("elephants", "elephants alone", "tab:green"),
                                              ("both", "beside the mice", "tab:orange"))):
        present = [(i, n) for i, n in enumerate(names) if key(mix, n) in rows]
        ax.bar([i + (k - 0.5) * width for i, _ in present],
               [rows[key(mix, n)]["elephants_over_ideal"] or 0 for _, n in present], width,
               label=label, color=colour)
        model = [(i + (k - 0.5) * width, rows[key(mix, n)]["model_s"]
                  / rows[key(mix, n)]["ideal_s"]) for i, n in present
                 if rows[key(mix, n)]["model_s"]]
        ax.scatter([x for x, _ in model], [y for _, y in model], marker="_", s=300,
                   color="black", zorder=3, label="max-min model" if k == 0 else None)
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xticks(range(len(names)), names)
    ax.set_title("elephants: JCT / ideal (S / B)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("mice and elephants per load-balancing mode and control (measured)",
                 fontsize=10)
    return save_plot(fig, folder, "mice_vs_elephants.png")


def _names(text: str, allowed, flag: str) -> list[str]:
    names = [n for n in text.split(",") if n] if text != "none" else []
    for n in names:
        if n not in allowed:
            raise ValueError(f"{flag} {n}: one of {', '.join(allowed)}"
                             + (" or none" if flag == "--controls" else ""))
    return names


def refusal(args) -> str:
    """What is wrong with the arguments, in one line ("" when nothing is)."""
    for flag, value in (("--message-bytes", args.message_bytes), ("--flows", args.flows),
                        ("--leaves", args.leaves), ("--spines", args.spines),
                        ("--hosts-per-leaf", args.hosts_per_leaf)):
        if value < 1:
            return f"{flag} {value}: must be at least 1"
    if not (math.isfinite(args.load) and 0 < args.load <= 0.95):
        return f"--load {args.load}: a fraction of the link above 0, at most 0.95"
    try:
        modes = _names(args.modes, MODES, "--modes")
        _names(args.controls, CONTROLS, "--controls")
    except ValueError as exc:
        return str(exc)
    if not modes:
        return f"--modes {args.modes!r}: at least one of {', '.join(MODES)}"
    try:
        load_sizes(args.sizes, "--sizes")
    except SpecError as exc:
        return str(exc)
    return rate_flag_error(args.rate_mbps) if args.rate_mbps else ""


def main(argv=None) -> int:
    knobs = MixKnobs()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"load-balancing modes, comma-separated ({', '.join(MODES)})")
    ap.add_argument("--controls", default=",".join(CONTROLS),
                    help=f"the mixed traffic again on ECMP with these ({', '.join(CONTROLS)}; "
                         "none: skip)")
    ap.add_argument("--sizes", default=SIZES,
                    help=f"the mice's flow sizes: a shipped distribution or a CDF file "
                         f"(default {SIZES})")
    ap.add_argument("--load", type=float, default=knobs.load,
                    help="each host's offered load of mice, a fraction of its link")
    ap.add_argument("--flows", type=int, default=knobs.flows, help="mice per run, all hosts")
    ap.add_argument("--message-bytes", type=int, default=knobs.message_bytes,
                    help="bytes each elephant carries")
    add_rate(ap, default="", help="endpoint link rate in Mbit/s, or auto (default: the "
             "topology's 100)")
    ap.add_argument("--leaves", type=int, default=knobs.leaves)
    ap.add_argument("--spines", type=int, default=knobs.spines)
    ap.add_argument("--hosts-per-leaf", type=int, default=knobs.hosts_per_leaf)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--results", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    bad = refusal(args)
    if bad:
        print(f"mice_vs_elephants: {bad}", file=sys.stderr)
        return 2
    modes = _names(args.modes, MODES, "--modes")
    controls = _names(args.controls, CONTROLS, "--controls")
    knobs = MixKnobs(sizes=args.sizes, load=args.load, flows=args.flows,
                     message_bytes=args.message_bytes,
                     rate=rate_arg(args.rate_mbps) if args.rate_mbps else "", seed=args.seed,
                     leaves=args.leaves, spines=args.spines,
                     hosts_per_leaf=args.hosts_per_leaf)
    folder = new_folder(args.results, "mice_vs_elephants")
    rows: dict = {}
    with marks_failure(folder):
        for mode in modes:
            for mix in MIXES:
                rows[key(mix, mode)] = measure(folder, mix, mode, knobs)
        for control in controls:
            rows[key("both", control)] = measure(folder, "both", control, knobs)
    made = plot(folder, rows, modes, controls)
    first = next(iter(rows.values()))
    small = first["mice"]["small_high_bytes"] if first["mice"] else None
    lines = ["# Mice and elephants: ECMP, DLB, spraying; PFC, DCQCN, NSCC", "",
             f"leaf-spine {knobs.leaves} leaves x {knobs.spines} spines x "
             f"{knobs.hosts_per_leaf} hosts, {first['link_mbps']:g} Mbit/s; mice "
             f"{knobs.flows} open-loop flows of {knobs.sizes} at load {knobs.load:g} per "
             f"host; elephants {knobs.message_bytes} B per host to a permutation peer; "
             f"seed {knobs.seed}; {machine_line()}.", "",
             finding(rows, modes, controls), "",
             "Slowdown: a flow's FCT over its time alone on the empty fabric. Small: the "
             f"smallest size bucket (flows up to {_f(small, '.0f')} B, about a tenth of "
             "them). While elephants ran: the mice that arrived before the elephants' last "
             "byte. Elephants' JCT: the permutation's (alone) or the background job's "
             "(both); ideal S / B; model: max-min on the paths the elephants took "
             "(testbed.attribution.collision_model_s). Modes and PFC run the UET-style "
             "transport; DCQCN runs RoCE.", "", *table(rows)]
    expected = expectations(rows, modes)
    lines += expectation_lines(expected)
    text = "\n".join(lines) + "\n"
    return finish_script(folder, text, {"runs": rows,
                                        "expected": [e.to_dict() for e in expected]}, [made])


if __name__ == "__main__":
    sys.exit(script_exit(main))
