#!/usr/bin/env python3
"""Benchmark: the credit-scheduled fabric against ECMP + PFC and spraying + PFC, on the
all-to-all of a 4 x 4 leaf-spine (16 endpoints), in rounds.

Each round runs the same all-to-all on three fabrics side by side (testbed.voq_fabric):
ecmp+pfc (RoCE, ECMP, PFC), spray+pfc (UET-style, sprayed, PFC) and scheduled (voq =
"scheduled": each sender's queue for a destination sends at the rate that destination's
egress grants, sprayed, the NIC's queues per destination, no pause; fabric.scheduled).
Per run: JCT / ideal (the ideal: every receiver's port busy at its line rate), the
spines' lossless queue p99 in frames (of the PFC controller's samples), pause frames,
credit frames, lossless drops, the controller's CPU (percent of one core) and the run's
fidelity verdict. A figure counts only from a faithful run; the ranges are over those.
Merges into results/bench.json: scheduled_alltoall_jct_over_ideal (median, with _min
and _max; goal <= 1.10), ecmp_pfc_alltoall_jct_over_ideal and
spray_pfc_alltoall_jct_over_ideal (the same), <fabric>_alltoall_spine_queue_p99_frames
and <fabric>_alltoall_pause_frames (medians), scheduled_alltoall_credit_frames,
scheduled_controller_cpu_percent beside spray_pfc_alltoall_controller_cpu_percent (the
PFC controller on the same fabric), scheduled_alltoall_lossless_drops (the most of any
counted run), scheduled_goal_met (1 when the largest counted
scheduled_alltoall_jct_over_ideal is <= 1.10), scheduled_bench_verdicts and the
machine's calibration.

    sudo .venv/bin/python scripts/bench_scheduled.py [--rounds 3] [--rate 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from testbed.benchmarks import machine_line, median_range, update_bench_json
from testbed.experiment import rate_arg
from testbed.rate import frame_bits
from testbed.script_args import add_rate, rate_flag_error
from testbed.voq_fabric import FabricKnobs, measure
from traffic.transport_settings import TransportSettings

ROOT = Path(__file__).resolve().parent.parent
FABRICS = ("ecmp+pfc", "spray+pfc", "scheduled")
GOAL = 1.10                 # the scheduled all-to-all's JCT over its ideal


def key(fabric: str) -> str:
    return fabric.replace("+", "_")


def figures(row: dict) -> dict:
    """One run's benchmark figures."""
    frame = frame_bits(TransportSettings().payload_bytes) / 8
    return {"jct_over_ideal": row["jct_over_ideal"],
            "spine_p99_frames": row["spine_queue_p99_bytes"] / frame,
            "pause_frames": row["pause_frames"], "credit_frames": row["credit_frames"],
            "drops": row["lossless_drops"], "cpu": row["controller_cpu_percent"],
            "fidelity": row["fidelity"], "counts": row["fidelity"] == "faithful",
            "exactly_once": row["exactly_once"]}


def record(runs: dict[str, list[dict]]) -> tuple[dict, list[str]]:
    """bench.json's figures from the counted (faithful) runs; the fabrics without one."""
    out: dict = {"scheduled_bench_verdicts": [f"round {i + 1} {fabric}: {f['fidelity']}"
                                              for fabric, rows in runs.items()
                                              for i, f in enumerate(rows)]}
    missing = []
    for fabric, rows in runs.items():
        counted = [f for f in rows if f["counts"]]
        if not counted:
            missing.append(fabric)
            continue
        k = f"{key(fabric)}_alltoall"
        over = [f["jct_over_ideal"] for f in counted]
        out |= {f"{k}_jct_over_ideal": round(statistics.median(over), 4),
                f"{k}_jct_over_ideal_min": round(min(over), 4),
                f"{k}_jct_over_ideal_max": round(max(over), 4),
                f"{k}_spine_queue_p99_frames": round(
                    statistics.median(f["spine_p99_frames"] for f in counted), 2),
                f"{k}_pause_frames": statistics.median(f["pause_frames"] for f in counted)}
        cpu = round(statistics.median(f["cpu"] for f in counted), 1)
        if fabric == "scheduled":
            out |= {"scheduled_controller_cpu_percent": cpu,
                    "scheduled_alltoall_credit_frames": statistics.median(
                        f["credit_frames"] for f in counted),
                    "scheduled_alltoall_lossless_drops": max(f["drops"] for f in counted),
                    "scheduled_goal_met": int(max(over) <= GOAL)}
        elif fabric == "spray+pfc":
            out["spray_pfc_alltoall_controller_cpu_percent"] = cpu
    return out, missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three fabrics")
    ap.add_argument("--message-bytes", type=int, default=1 << 20,
                    help="bytes each host sends")
    add_rate(ap, default="10", help="endpoint link rate in Mbit/s, or auto (default 10: the "
             "scheduled fabric's controller and 16 endpoints stay faithful on 2 cores)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    ap.add_argument("--keep", action="store_true", help="keep the runs' results folders")
    ap.add_argument("--smoke", action="store_true",
                    help="2 leaves x 2 spines x 2 hosts, 128 KiB (a check, not a figure)")
    args = ap.parse_args(argv)
    for flag, value in (("--rounds", args.rounds), ("--message-bytes", args.message_bytes)):
        if value < 1:
            print(f"bench_scheduled: {flag} {value}: must be at least 1", file=sys.stderr)
            return 2
    if bad := rate_flag_error(args.rate_mbps):
        print(f"bench_scheduled: {bad}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_scheduled: needs root (builds a fabric)", file=sys.stderr)
        return 2
    knobs = FabricKnobs(message_bytes=args.message_bytes, rate=rate_arg(args.rate_mbps))
    if args.smoke:
        knobs.message_bytes, knobs.leaves, knobs.spines, knobs.hosts_per_leaf = \
            128 << 10, 2, 2, 2
    print(f"# all-to-all on a {knobs.leaves} x {knobs.spines} leaf-spine "
          f"({knobs.leaves * knobs.hosts_per_leaf} endpoints), {knobs.message_bytes} B a host "
          f"at {args.rate_mbps} Mbit/s, {' / '.join(FABRICS)} x{args.rounds}; {machine_line()}")
    print(f"# JCT/ideal: goal <= {GOAL} for the scheduled fabric; spine p99: the spines' "
          "lossless queue p99 in frames (controller samples); cpu: the controller's")
    print(f"# {'round':>5} {'fabric':>9} {'JCT/ideal':>9} {'spine p99':>9} {'pauses':>6} "
          f"{'credits':>7} {'drops':>5} {'cpu %core':>9}  fidelity")
    runs: dict[str, list[dict]] = {f: [] for f in FABRICS}
    with tempfile.TemporaryDirectory(prefix="aft-bench-scheduled-") as tmp:
        base = ROOT / "results" if args.keep else Path(tmp)
        for r in range(args.rounds):
            for fabric in FABRICS:
                f = figures(measure(base, fabric, "alltoall", knobs))
                runs[fabric].append(f)
                print(f"  {r + 1:>5} {fabric:>9} {f['jct_over_ideal']:>9.3f} "
                      f"{f['spine_p99_frames']:>9.1f} {f['pause_frames']:>6} "
                      f"{f['credit_frames']:>7} {f['drops']:>5} {f['cpu']:>9.1f}  "
                      f"{f['fidelity']}" + ("" if f["counts"] else " (does not count, "
                                                                   "not a faithful run)"))
    values, missing = record(runs)
    for fabric in FABRICS:
        counted = [f for f in runs[fabric] if f["counts"]]
        if not counted:
            print(f"{fabric}: no faithful run of {args.rounds}: no figure recorded")
            continue
        print(f"{fabric}: over {len(counted)} faithful runs of {args.rounds}: JCT / ideal "
              f"{median_range([f['jct_over_ideal'] for f in counted])}, spines' queue p99 "
              f"{median_range([f['spine_p99_frames'] for f in counted], '.1f')} frames, pause "
              f"frames {median_range([f['pause_frames'] for f in counted], '.0f')}, controller "
              f"CPU {median_range([f['cpu'] for f in counted], '.1f')} % of a core")
    if "scheduled_goal_met" in values:
        print(f"goal: scheduled_alltoall_jct_over_ideal <= {GOAL} in every faithful run: "
              + ("met" if values["scheduled_goal_met"] else "NOT met"))
    update_bench_json(Path(args.out), values)
    print(f"recorded in {args.out}")
    ok = all(f["exactly_once"] for rows in runs.values() for f in rows)
    return 0 if ok and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
