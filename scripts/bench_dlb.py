#!/usr/bin/env python3
"""Benchmark: switch DLB against static ECMP, 8 elephants over 8 spines, 8 seeds.

Leaf-spine, 2 leaves x 8 hosts, 8 spines: l0hK -> l1hK for K = 0..7, one elephant each,
UET transport (in-order not needed), lossless class without PFC (the switches count its
queues). Per seed, side by side: the kernel's ECMP hash (switch_lb = ecmp; the seed is
also the ECMP hash seed where the kernel has it) and switch DLB (fabric.switch_lb). The
busiest leaf0 uplink's bytes over the mean (1.0: even; ECMP's collisions put two or three
elephants on one spine), and JCT over the ideal S / B (every elephant on its own spine).
Goals: dlb_uplink_max_over_mean <= 1.15 and dlb_jct_over_ideal <= 1.15, from
faithful runs. Merges into results/bench.json: dlb_uplink_max_over_mean,
dlb_jct_over_ideal, dlb_fidelity and the ecmp_* twins (the worst over the seeds).

    sudo .venv/bin/python scripts/bench_dlb.py [--seeds 8] [--rate 25]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from testbed.benchmarks import machine_line, update_bench_json
from testbed.experiment import finite_float, from_toml
from testbed.run import run
from testbed.script_args import add_rate

ROOT = Path(__file__).resolve().parent.parent

ELEPHANTS = 8


def measure(mode: str, seed: int, args, base: str) -> dict:
    exp = from_toml(None, {
        "name": f"bench_{mode}_s{seed}", "workload": "p2p",
        "pairs": [f"l0h{k}>l1h{k}" for k in range(ELEPHANTS)],
        "message_bytes": args.message_bytes, "iterations": 1, "transport": "uet",
        "entropy": "ecmp", "pfc": "off", "switch_lb": mode, "seed": seed,
        "results_dir": base, "timeout_s": 300.0, "rto_ms": 200.0,
        "topology": {"name": "dlb8", "kind": "leaf_spine", "params": {
            "leaves": 2, "spines": ELEPHANTS, "hosts_per_leaf": ELEPHANTS,
            "rate_mbps": args.rate_mbps}}})
    folder, m = run(exp, progress=lambda s: print(f"  {s}", file=sys.stderr))
    return {"max_over_mean": m["links"]["uplink_max_over_mean"],
            "jct_over_ideal": m["jct_over_ideal"], "fidelity": m["fidelity"]["verdict"],
            "steered": (m["pfc"].get("switch_lb") or {}).get("steered", 0),
            "folder": str(folder)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--message-bytes", type=int, default=1_000_000, help="bytes per elephant")
    add_rate(ap, type=finite_float, default=25.0,
             help="host and uplink rate (25: 16 agents stay faithful on 2 cores; at "
             "100 they did not)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    ap.add_argument("--keep", action="store_true", help="keep the runs' results folders")
    args = ap.parse_args(argv)
    base = str(ROOT / "results") if args.keep else tempfile.mkdtemp(prefix="aft-bench-")
    print(f"# {ELEPHANTS} elephants over {ELEPHANTS} spines at {args.rate_mbps:g} Mbit/s, "
          f"{args.message_bytes} B each; {machine_line()}")
    print(f"# {'seed':>4s} {'switch':>6s} {'uplink max/mean':>15s} {'JCT/ideal':>9s} "
          f"{'steered':>8s}  fidelity")
    runs: dict[str, list[dict]] = {"ecmp": [], "dlb": []}
    for seed in range(1, args.seeds + 1):
        for mode in ("ecmp", "dlb"):
            r = measure(mode, seed, args, base)
            runs[mode].append(r)
            print(f"  {seed:4d} {mode:>6s} {r['max_over_mean']:15.3f} "
                  f"{r['jct_over_ideal']:9.3f} {r['steered']:8d}  {r['fidelity']}")
    record = {}
    for mode, rows in runs.items():
        faithful = [r for r in rows if r["fidelity"] == "faithful"] or rows
        record[f"{mode}_uplink_max_over_mean"] = round(max(r["max_over_mean"]
                                                           for r in faithful), 4)
        record[f"{mode}_uplink_max_over_mean_mean"] = round(
            sum(r["max_over_mean"] for r in faithful) / len(faithful), 4)
        record[f"{mode}_jct_over_ideal"] = round(max(r["jct_over_ideal"] for r in faithful), 4)
        good = sum(r["fidelity"] == "faithful" for r in rows)
        record[f"{mode}_fidelity"] = f"{good} of {len(rows)} faithful"
    record["dlb_link_mbps"] = args.rate_mbps
    print(f"DLB: uplink max/mean {record['dlb_uplink_max_over_mean']} (goal <= 1.15), "
          f"JCT/ideal {record['dlb_jct_over_ideal']} (goal <= 1.15); ECMP: "
          f"{record['ecmp_uplink_max_over_mean']}, {record['ecmp_jct_over_ideal']} "
          "(worst over the faithful seeds)")
    update_bench_json(Path(args.out), record)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
