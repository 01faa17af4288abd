#!/usr/bin/env python3
"""Benchmark: the agents' CPU per packet against the kernel's, interpreted and compiled.

Part of a delivered packet's CPU is not the testbed's to cut: the kernel's own work, the
agents' syscalls (sendto, recv, the qdisc and veth transmit) and softirq forwarding (veth
delivery, the switch namespaces' routing, tc), which is the emulated network itself. The
rest is the agents' own: their user time (the per-packet Python, or the compiled path of
traffic.engine) and the run's process. This runs scripts/profile_packet.py's measurement
(perf record -a, the workload window split per delivered data packet) on the 16-rank
ring all-reduce at 100 Mbit/s (one agent process per core), the interpreted engine
(AFT_ENGINE=interpreted) and the compiled one alternated --rounds times, and sets the
agents' share against the kernel's:

    kernel = agents_sys + softirq_irq;   agents = agents_user + run_process
    goal: agents (compiled) <= kernel / 3 (both medians, the same runs)

and the kernel's share against its floor: the same ring on the same veths and routers
with no qdisc on any port (fabric.shaping's plain layout, what Mininet without TCLink
costs; links at CPU speed), compiled, in the same rounds:

    kernel_share_over_plain_forwarding = kernel (compiled, shaped) / kernel (plain)

with the kernel's share named per part (testbed.kernel_split: the timer interrupts that
pace the shaped ports, the qdiscs, forwarding, the sockets, ...), medians of each layout;
and what the kernel share alone asks of this machine at --target-ranks (a ring at link
rate: every rank sends rate / frame_bits packets/s):

    kernel load = target_ranks x rate / frame_bits x kernel_us / (cores x 1e6)

Merges into results/bench.json: cpu_us_per_packet_agents (compiled, median, with
_min/_max), cpu_us_per_packet_agents_before (interpreted, the same), the goal
cpu_us_per_packet_agents_goal (kernel / 3) and cpu_us_per_packet_agents_goal_met (1/0),
cpu_floor_kernel_us_per_packet (median of the compiled runs, with _min/_max),
cpu_floor_kernel_us_per_packet_plain (the plain layout's, the same), their ratio
kernel_share_over_plain_forwarding, cpu_floor_kernel_parts_us and _plain (per named part),
cpu_floor_timer_interrupts_per_packet (perf stat's, shaped),
cpu_floor_kernel_load_goal_ranks (the load above, a fraction of the cores),
cpu_floor_max_ranks_kernel_only (the most ranks the kernel share alone leaves room for),
cpu_floor_agents_budget_us (what the cores leave per packet for the agents' own CPU at
--target-ranks, beside the kernel's share), cpu_floor_interpreted_total_us /
cpu_floor_compiled_total_us (medians) and cpu_floor_fidelity (each run's verdict, in
order).

    sudo .venv/bin/python scripts/bench_floor.py [--ranks 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from profile_packet import measure

from fabric.shaping import PLAIN, SHAPED
from testbed.benchmarks import machine_line, update_bench_json
from testbed.experiment import Experiment, finite_float
from testbed.rate import frame_bits
from testbed.script_args import add_rate
from traffic.engine import COMPILED, INTERPRETED, engine, engine_env
from traffic.transport_settings import COALESCE_FRAMES

ROOT = Path(__file__).resolve().parent.parent

GOAL_RATIO = 1 / 3                 # the agents' own share at most a third of the kernel's
PLAIN_GOAL = 1.5                   # the kernel's share at most 1.5x the plain layout's
KERNEL_PARTS = ("agents_sys", "kernel_softirq_irq")
AGENT_PARTS = ("agents_user", "run_process")
PAYLOAD_BYTES = Experiment.payload_bytes  # what profile_packet's runs send
ENGINES = (INTERPRETED, COMPILED)
RUNS = ((INTERPRETED, SHAPED), (COMPILED, SHAPED), (COMPILED, PLAIN))   # each round


def split(rec: dict) -> dict:
    """total, kernel (the agents' syscalls and softirq forwarding) and the agents' own
    share (their user time and the run's process), us per packet."""
    p = rec["parts_us_per_packet"]
    return {"total": rec["total_us_per_packet"], "kernel": sum(p[k] for k in KERNEL_PARTS),
            "agents": sum(p[k] for k in AGENT_PARTS)}


def _spread(name: str, values: list[float]) -> dict:
    return {name: round(statistics.median(values), 2), f"{name}_min": round(min(values), 2),
            f"{name}_max": round(max(values), 2)}


def floor_verdict(before: list[float], agents: list[float], kernels: list[float],
                  target_ranks: int, rate_mbps: float, cores: int,
                  payload_bytes: int = PAYLOAD_BYTES) -> dict:
    """The agents' share (compiled, and `before`: interpreted) against the goal of a
    third of the kernel's share, and what the kernel's share asks at target_ranks."""
    kernel = statistics.median(kernels)
    goal = kernel * GOAL_RATIO
    pps_per_rank = rate_mbps * 1e6 / frame_bits(payload_bytes)
    load = target_ranks * pps_per_rank * kernel / (cores * 1e6)
    return {**_spread("cpu_us_per_packet_agents", agents),
            **_spread("cpu_us_per_packet_agents_before", before),
            "cpu_us_per_packet_agents_goal": round(goal, 2),
            "cpu_us_per_packet_agents_goal_met": int(statistics.median(agents) <= goal),
            **_spread("cpu_floor_kernel_us_per_packet", kernels),
            "cpu_floor_kernel_load_goal_ranks": round(load, 3),
            # what is left per packet for the agents' own CPU at target_ranks (< 0: none)
            "cpu_floor_agents_budget_us": round(cores * 1e6 / (target_ranks * pps_per_rank)
                                                - kernel, 2),
            "cpu_floor_max_ranks_kernel_only": int(cores * 1e6 / (pps_per_rank * kernel))
            if kernel > 0 else None}


def plain_floor(shaped: list[dict], plain: list[dict]) -> dict:
    """The shaped runs' kernel share against the plain layout's (medians, same rounds),
    and both named per part (medians part by part)."""
    kernel = statistics.median(r["kernel"] for r in shaped)
    floor = statistics.median(r["kernel"] for r in plain)

    def parts(rows):
        return {k: round(statistics.median(r["parts"][k] for r in rows), 2)
                for k in rows[0]["parts"]}
    timers = [r["timer_interrupts"] for r in shaped if r["timer_interrupts"] is not None]
    return {**_spread("cpu_floor_kernel_us_per_packet_plain", [r["kernel"] for r in plain]),
            "kernel_share_over_plain_forwarding": round(kernel / floor, 2) if floor else None,
            "kernel_share_over_plain_forwarding_goal_met": int(bool(floor)
                                                               and kernel / floor
                                                               <= PLAIN_GOAL),
            "cpu_floor_kernel_parts_us": parts(shaped),
            "cpu_floor_kernel_parts_us_plain": parts(plain),
            "cpu_floor_timer_interrupts_per_packet": round(statistics.median(timers), 3)
            if timers else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16)
    add_rate(ap, type=finite_float, default=100.0)
    ap.add_argument("--message-bytes", type=int, default=2 << 20, help="bytes per rank")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3,
                    help="interpreted/compiled pairs, alternated")
    ap.add_argument("--target-ranks", type=int, default=32,
                    help="the ring size the kernel's load is worked out for")
    ap.add_argument("--freq", type=int, default=997, help="perf samples per second per core")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    for name in ("ranks", "iterations", "rounds", "target-ranks", "message-bytes"):
        if getattr(args, name.replace("-", "_")) < 1:
            print(f"error: --{name} must be at least 1", file=sys.stderr)
            return 2
    if args.rate_mbps <= 0:
        print("error: --rate must be above 0", file=sys.stderr)
        return 2
    if shutil.which("perf") is None:
        print("error: needs perf (linux-perf) to split the kernel's share from the "
              "agents'", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    print(f"# CPU per delivered packet, {args.ranks}-rank ring all-reduce, one-tier, "
          f"{args.rate_mbps:g} Mbit/s, one agent process per core, the interpreted and "
          f"compiled engines and the compiled on plain ports alternated x{args.rounds}; "
          f"{machine_line()}")
    if engine() != COMPILED:
        print(f"error: the compiled path is not built here ({engine()}): run "
              "'bash scripts/setup.sh'", file=sys.stderr)
        return 2
    got: dict[tuple[str, str], list[dict]] = {run: [] for run in RUNS}
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="bench_floor_") as base:
        for r in range(args.rounds):
            for eng, layout in RUNS:
                print(f"round {r + 1}/{args.rounds}: {eng} engine, {layout} ports",
                      file=sys.stderr)
                run_args = argparse.Namespace(
                    ranks=args.ranks, rate_mbps=args.rate_mbps,
                    message_bytes=args.message_bytes, iterations=args.iterations,
                    freq=args.freq, processes=0, coalesce_frames=COALESCE_FRAMES, pfc=False,
                    layout=layout)
                with engine_env(eng):                  # the agents inherit it
                    _, rec = measure(run_args, Path(base))
                if any(e != eng for e in rec["engines"]):
                    print(f"error: the {eng} run's agents ran {rec['engines']}",
                          file=sys.stderr)
                    return 1
                got[eng, layout].append({
                    **split(rec), "fidelity": rec["fidelity"],
                    "jct_over_ideal": rec["jct_over_ideal"],
                    "parts": rec["kernel_parts_us_per_packet"],
                    "timer_interrupts": rec["events_per_packet"].get("timer_interrupts")})
                verdicts.append(f"{eng}/{layout}:{rec['fidelity']}")
    print(f"{'engine':>11s} {'ports':>6s} {'total':>8s} {'kernel':>8s} {'agents':>8s} "
          f"{'JCT/ideal':>9s}  fidelity   (us per delivered data packet)")
    for (eng, layout), rows in got.items():
        for row in rows:
            print(f"{eng:>11s} {layout:>6s} {row['total']:8.2f} {row['kernel']:8.2f} "
                  f"{row['agents']:8.2f} {row['jct_over_ideal'] or 0:9.3f}  {row['fidelity']}")
    shaped, plain = got[COMPILED, SHAPED], got[COMPILED, PLAIN]
    record = floor_verdict([r["agents"] for r in got[INTERPRETED, SHAPED]],
                           [r["agents"] for r in shaped],
                           [r["kernel"] for r in shaped], args.target_ranks,
                           args.rate_mbps, cores)
    record.update({
        "cpu_floor_interpreted_total_us": round(statistics.median(
            r["total"] for r in got[INTERPRETED, SHAPED]), 2),
        "cpu_floor_compiled_total_us": round(statistics.median(
            r["total"] for r in shaped), 2),
        **plain_floor(shaped, plain),
        "cpu_floor_ranks": args.ranks, "cpu_floor_fidelity": verdicts})
    met = "met" if record["cpu_us_per_packet_agents_goal_met"] else "NOT met"
    print(f"the agents' own share (user time + the run's process): compiled "
          f"{record['cpu_us_per_packet_agents']} us "
          f"({record['cpu_us_per_packet_agents_min']}-{record['cpu_us_per_packet_agents_max']})"
          f", interpreted {record['cpu_us_per_packet_agents_before']} us "
          f"({record['cpu_us_per_packet_agents_before_min']}-"
          f"{record['cpu_us_per_packet_agents_before_max']}); goal: a third of the kernel's "
          f"share ({record['cpu_floor_kernel_us_per_packet']} us / 3 = "
          f"{record['cpu_us_per_packet_agents_goal']} us): {met}")
    print(f"kernel share alone at {args.target_ranks} ranks: {args.target_ranks} x "
          f"{args.rate_mbps:g} Mbit/s / {frame_bits(PAYLOAD_BYTES)} bits x "
          f"{record['cpu_floor_kernel_us_per_packet']} us = "
          f"{100 * record['cpu_floor_kernel_load_goal_ranks']:.0f} % of {cores} cores; it "
          f"leaves room for {record['cpu_floor_max_ranks_kernel_only']} ranks at most")
    print(f"the agents' own CPU at {args.target_ranks} ranks: {cores} cores over "
          f"{args.target_ranks} ranks' packets leave "
          f"{record['cpu_floor_agents_budget_us']} us per packet beside the kernel's; "
          f"the compiled agents take {record['cpu_us_per_packet_agents']:.2f} us")
    parts = record["cpu_floor_kernel_parts_us"]
    print(f"the kernel's share over its floor (no qdisc on any port, the same ring): "
          f"{record['cpu_floor_kernel_us_per_packet']} us / "
          f"{record['cpu_floor_kernel_us_per_packet_plain']} us = "
          f"{record['kernel_share_over_plain_forwarding']}x (goal <= {PLAIN_GOAL}); "
          f"{record['cpu_floor_timer_interrupts_per_packet']} timer interrupts per packet")
    print("  named, shaped (plain) us per packet: " + ", ".join(
        f"{k} {v:.2f} ({record['cpu_floor_kernel_parts_us_plain'][k]:.2f})"
        for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.05))
    update_bench_json(Path(args.out), record)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    from testbed.results import script_exit
    sys.exit(script_exit(main))
