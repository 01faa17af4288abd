#!/usr/bin/env python3
"""Benchmark: PFC controller reaction time and CPU cost on a fabric with 16 switches.

    leaf_spine(leaves=12, spines=4, hosts_per_leaf=1): 16 switches, 12 hosts, 100 Mbit/s
    incast: l0h0, l1h0, l2h0 -> l3h0 (RoCE, DSCP 26), PFC on, XOFF 64 KiB / XON 32 KiB

What is measured, per pause the controller sends (testbed.pfc):
  reaction = estimated XOFF crossing (occupancy interpolated between the last poll
  below XOFF and the first above) -> the upstream's lossless class held (the netlink
  ACK of the tc change). The upper bound (last poll below XOFF -> held) and the frame
  time (crossing -> the PFC frame handed to the port's qdisc, its control class) too.
  CPU = the controller thread's CPU time over its wall time (percent of one core),
  polling all 16 switches every poll_ms.
Records pfc_reaction_ms (median), pfc_reaction_p99_ms, pfc_frame_ms (median),
pfc_controller_cpu_percent and pfc_poll_cycle_16sw_ms in results/bench.json.
Goal: reaction under 2 ms.

    sudo .venv/bin/python scripts/bench_pfc.py [--bytes 2000000] [--poll-ms 1] [--out F]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabric.core import Fabric  # noqa: E402
from fabric.lossless import PfcSettings  # noqa: E402
from testbed import pfc  # noqa: E402
from testbed.benchmarks import update_bench_json  # noqa: E402
from topologies import leaf_spine  # noqa: E402
from traffic.launch import run_agents  # noqa: E402
from traffic.workloads import build_schedule  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=2_000_000, help="bytes per incast sender")
    ap.add_argument("--poll-ms", type=float, default=1.0)
    ap.add_argument("--leaves", type=int, default=12)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_pfc: needs root (builds a fabric)", file=sys.stderr)
        return 2
    topo = leaf_spine(leaves=args.leaves, spines=args.spines, hosts_per_leaf=1,
                      queue_bytes=1 << 20)
    ranks = [f"l{i}h0" for i in range(min(4, args.leaves))]
    settings = PfcSettings(mode="on", poll_ms=args.poll_ms, xoff_bytes=64 * 1024,
                           xon_bytes=32 * 1024)
    with Fabric(topo, lab=f"bpfc{os.getpid()}") as fab, \
            pfc.pfc_running(fab, settings) as ctl, tempfile.TemporaryDirectory() as tmp:
        res = run_agents(fab, build_schedule("incast", ranks, args.bytes),
                         workdir=tmp, window_packets=256, timeout_s=60)
        ok = all(r["ok"] for r in res.values())
    rep = ctl.report()
    r, up, c = rep["reaction_ms"], rep["reaction_upper_ms"], rep["controller"]
    fr = rep["frame_ms"]
    cal = rep["calibration"]
    print(f"# PFC controller, {c['switches']} switches, poll every {args.poll_ms:g} ms "
          f"(SCHED_FIFO: {cal.get('realtime')})")
    print(f"{'pauses':>8} {'p50 ms':>8} {'mean ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'upper p50':>10} {'frame p50':>10} {'cpu %core':>10} {'cycle ms':>9} "
          f"{'late polls':>11}")
    print(f"{r.get('count', 0):>8} {r.get('p50', float('nan')):>8.3f} "
          f"{r.get('mean', float('nan')):>8.3f} {r.get('p99', float('nan')):>8.3f} "
          f"{r.get('max', float('nan')):>8.3f} {up.get('p50', float('nan')):>10.3f} "
          f"{fr.get('p50', float('nan')):>10.3f} "
          f"{c['cpu_percent_of_core']:>10.1f} {cal['poll_cycle_ms']:>9.3f} "
          f"{c['late_polls']:>11}")
    print(f"workload ok: {ok}; lossless drops: {rep['totals']['drops']}; "
          f"frames: {rep['totals']['frames_sent']}; goal: reaction p50 < 2 ms: "
          f"{'met' if r.get('p50', 99) < 2 else 'NOT met'}")
    if not r.get("count"):
        print("bench_pfc: no pause happened; nothing measured", file=sys.stderr)
        return 1
    update_bench_json(args.out, {
        "pfc_reaction_ms": r["p50"], "pfc_reaction_p99_ms": r["p99"],
        "pfc_frame_ms": fr["p50"],
        "pfc_controller_cpu_percent": c["cpu_percent_of_core"],
        "pfc_poll_cycle_16sw_ms": cal["poll_cycle_ms"]})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
