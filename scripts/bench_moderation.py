#!/usr/bin/env python3
"""Benchmark: what the agents' interrupt moderation costs a transfer, and what it saves.

    l0h0 ── leaf0 ══ spine0 | spine1 ══ leaf1 ── l1h0      every link 100 Mbit/s
    p2p l0h0 -> l1h0, RoCE, static ECMP, moderation off (0) and on (3 frame times)

What is measured, per setting, over `--rounds` alternating rounds (medians): the
transfer time (first to last data arrival at the receiver) and the receiver's wake-ups
per data packet while data flows. Moderation should batch wake-ups (about one per 3
frames instead of one per frame) and leave the transfer time alone: the network, not
the agent, sets the pace. That second figure depends on the CPU, which is why it is a
benchmark and not a test (tests/test_transport.py keeps the wake-up bound).
Records moderation_transfer_ratio (on / off, goal <= 1.15) and
moderation_wakeups_per_packet (on) in results/bench.json.

    sudo .venv/bin/python scripts/bench_moderation.py [--rounds 3] [--bytes 4000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from fabric.core import Fabric
from testbed.benchmarks import update_bench_json
from testbed.experiment import finite_float
from topologies import leaf_spine
from traffic.launch import run_agents
from traffic.transport_settings import COALESCE_FRAMES
from traffic.workloads import build_schedule

ROOT = Path(__file__).resolve().parent.parent


def measure(fab: Fabric, size_bytes: int, coalesce_frames: float) -> tuple[float, float]:
    """(transfer seconds, receiver wake-ups per data packet) of one p2p transfer."""
    res = run_agents(fab, build_schedule("p2p", ["l0h0", "l1h0"], size_bytes),
                     coalesce_frames=coalesce_frames, rto_ms=250)
    bad = {n: r["error"] for n, r in res.items() if not r["ok"]}
    if bad:
        raise RuntimeError(f"agents failed: {bad}")
    (recv,) = res["l1h0"]["flows"]
    if not recv["exactly_once"]:
        raise RuntimeError("the transfer was not delivered exactly once")
    return ((recv["end_ns"] - recv["start_ns"]) / 1e9,
            res["l1h0"]["wakeups_until_done"] / recv["packets"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bytes", type=int, default=4_000_000, help="bytes per transfer")
    ap.add_argument("--coalesce-frames", type=finite_float, default=COALESCE_FRAMES)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_moderation: needs root (builds a fabric)", file=sys.stderr)
        return 2
    runs: dict[float, list[tuple[float, float]]] = {0.0: [], args.coalesce_frames: []}
    topo = leaf_spine(leaves=2, spines=2, hosts_per_leaf=1)
    with Fabric(topo, lab=f"bmod{os.getpid()}") as fab:
        for r in range(args.rounds):
            for frames, got in runs.items():
                got.append(measure(fab, args.bytes, frames))
                print(f"round {r + 1}/{args.rounds}: moderation {frames:g} frames: "
                      f"{got[-1][0]:.3f} s, {got[-1][1]:.2f} wake-ups per packet",
                      file=sys.stderr, flush=True)
    (off_s, off_w), (on_s, on_w) = [
        (statistics.median(s for s, _ in got), statistics.median(w for _, w in got))
        for got in runs.values()]
    results = {"moderation_transfer_ratio": round(on_s / off_s, 3),
               "moderation_wakeups_per_packet": round(on_w, 3)}
    print(f"# interrupt moderation, p2p {args.bytes} B at 100 Mbit/s, median of "
          f"{args.rounds} rounds")
    print(f"# {'moderation':>10s} {'transfer (s)':>12s} {'wake-ups/packet':>15s}")
    print(f"  {'off':>10s} {off_s:12.3f} {off_w:15.2f}")
    print(f"  {f'{args.coalesce_frames:g} frames':>10s} {on_s:12.3f} {on_w:15.2f}")
    print(f"  moderation_transfer_ratio {results['moderation_transfer_ratio']:.3f} "
          f"(goal <= 1.15)")
    update_bench_json(Path(args.out), results)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
