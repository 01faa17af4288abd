#!/usr/bin/env python3
"""Benchmark: a permutation under ECMP and PFC, every flow's time explained.

A 4 x 4 leaf-spine with 4 hosts per leaf (uplinks as fast as host links, so the fabric
is non-blocking only if the hash spreads the flows), every host sending 2 MiB to one
other (the workload's seeded permutation), `--rate auto`. Three ways, each over the
same seeds: ECMP with PFC (RoCE); ECMP without PFC on queues deep enough for every
window that can meet at a port (the collision model alone); spraying with PFC (the
UET-style transport). Each run's JCT is printed beside the collision model's: the
same flows on the kernel's own paths (flows.csv), all starting together, each link
shared max-min fairly until every flow is done (testbed.attribution.fluid_completion),
and beside how the flows' time split (testbed.attribution: serialization at the fair
share, capacity PFC's pauses took, ACKs held on the way back, recovery, starvation,
unexplained). Merges into results/bench.json: permutation_unexplained_fraction (the
largest unexplained share of any flow's time, ECMP with PFC, goal <= 5 %),
permutation_slow_unexplained_fraction (the largest share by which a flow was slower
than its causes explain), permutation_last_flow_unexplained_fraction (of the flow that
ended last, the one that set the JCT), permutation_{pfc,deep,spray}_jct_over_model (and
_min) and the machine's calibration.

    sudo .venv/bin/python scripts/bench_permutation.py [--seeds 1 2 3 4]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

from testbed import attribution as att
from testbed.benchmarks import machine_line, rate_auto, update_bench_json
from testbed.experiment import from_toml
from testbed.run import run
from traffic.agent_config import FRAME_OVERHEAD_BYTES
from traffic.transport_settings import TransportSettings

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = 2 * 1024 * 1024
MODES = {"pfc": ("ecmp", "roce", "on"), "deep": ("ecmp", "roce", "off"),
         "spray": ("spray", "uet", "on")}
SHOWN = ("serialization_s", "paused_s", "acks_s", "recovery_s", "starved_s")


def deep_queue_bytes(hosts: int) -> int:
    """Every window that can meet at one port: all hosts' flows, twice (go-back-N)."""
    window = TransportSettings().window_packets
    return 2 * hosts * window * (4096 + FRAME_OVERHEAD_BYTES)


def measure(mode: str, seed: int, args, base: str) -> dict:
    entropy, transport, pfc = MODES[mode]
    hosts = args.leaves * args.hosts_per_leaf
    params = {"leaves": args.leaves, "spines": args.spines,
              "hosts_per_leaf": args.hosts_per_leaf}
    if mode == "deep":
        params["queue_bytes"] = deep_queue_bytes(hosts)
    exp = from_toml(None, {
        "name": f"bench_permutation_{mode}", "workload": "permutation",
        "message_bytes": args.message_bytes, "iterations": 1, "entropy": entropy,
        "transport": transport, "pfc": pfc, "seed": seed, "rate": "auto",
        "results_dir": base, "timeout_s": 600.0,
        "topology": {"kind": "leaf_spine", "params": params}})
    folder, m = run(exp, progress=lambda s: print(f"  {s}", file=sys.stderr))
    with open(folder / "flows.csv") as fh:
        sends = [r for r in csv.DictReader(fh) if r["role"] == "send" and r.get("path")]
    model = att.collision_model_s(sends, from_toml(folder / "config.toml").resolve_topology())
    split = m["attribution"]
    last = max(sends, key=lambda r: int(r["end_ns"]))     # the flow that set the JCT
    slow = max(float(r["unexplained_s"]) / float(r["fct_s"]) for r in sends)
    return {"last_unexplained": abs(float(last["unexplained_s"])) / float(last["fct_s"]),
            "slow_unexplained": max(0.0, slow),
            "mode": mode, "seed": seed, "jct_over_ideal": m["jct_over_ideal"],
            "model_over_ideal": model / m["ideal_s"], "jct_over_model": m["jct_mean_s"] / model,
            "uplink_max_over_mean": m["links"]["uplink_max_over_mean"],
            "paused_s": (m.get("pfc") or {}).get("totals", {}).get("paused_s", 0.0),
            "shares": split.get("share_of_flow_time") or {},
            "unexplained_max": split.get("unexplained_max_fraction"),
            "worst_flow": split.get("unexplained_max_flow"),
            "fidelity": m["fidelity"]["verdict"], "folder": str(folder)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--message-bytes", type=int, default=MESSAGE, help="bytes per flow")
    ap.add_argument("--leaves", type=int, default=4)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--hosts-per-leaf", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    ap.add_argument("--keep", action="store_true", help="keep the runs' results folders")
    args = ap.parse_args(argv)
    base = str(ROOT / "results") if args.keep else tempfile.mkdtemp(prefix="aft-bench-")
    print(f"# permutation of {args.message_bytes} B on a {args.leaves}x{args.spines} leaf-spine, "
          f"{args.hosts_per_leaf} hosts per leaf, --rate auto; {machine_line()}")
    print("# expected: the collision model, max-min on the kernel's paths with every flow "
          "starting together (Bertsekas & Gallager 6.5.2); ideal = S / B")
    print(f"# {'mode':>5s} {'seed':>4s} {'JCT/ideal':>9s} {'model':>6s} {'JCT/model':>9s} "
          f"{'uplink':>6s} {'paused s':>8s}  " + " ".join(f"{p[:-2][:6]:>6s}" for p in SHOWN)
          + f" {'unexpl':>6s} {'worst':>6s} {'last':>6s}  fidelity")
    runs = []
    for seed in args.seeds:
        for mode in args.modes:
            r = measure(mode, seed, args, base)
            runs.append(r)
            s = r["shares"]
            print(f"  {mode:>5s} {seed:4d} {r['jct_over_ideal']:9.3f} "
                  f"{r['model_over_ideal']:6.3f} {r['jct_over_model']:9.3f} "
                  f"{r['uplink_max_over_mean'] or 0:6.2f} {r['paused_s']:8.2f}  "
                  + " ".join(f"{100 * s.get(p, 0):5.1f}%" for p in SHOWN)
                  + f" {100 * s.get('unexplained_s', 0):5.1f}% "
                  f"{100 * (r['unexplained_max'] or 0):5.1f}% "
                  f"{100 * r['last_unexplained']:5.1f}%  {r['fidelity']}")
    record = {}
    for mode in args.modes:
        mine = [r for r in runs if r["mode"] == mode]
        faithful = [r for r in mine if r["fidelity"] == "faithful"] or mine
        ratios = [r["jct_over_model"] for r in faithful]
        record[f"permutation_{mode}_jct_over_model"] = round(max(ratios), 4)
        record[f"permutation_{mode}_jct_over_model_min"] = round(min(ratios), 4)
        record[f"permutation_{mode}_fidelity"] = ", ".join(sorted({r["fidelity"]
                                                                   for r in mine}))
        print(f"{mode}: JCT / collision model {min(ratios):.3f}-{max(ratios):.3f} over "
              f"{len(faithful)} faithful runs")
    pfc = [r for r in runs if r["mode"] == "pfc" and r["unexplained_max"] is not None]
    if pfc:
        faithful = [r for r in pfc if r["fidelity"] == "faithful"] or pfc
        worst = max(faithful, key=lambda r: r["unexplained_max"])
        record["permutation_unexplained_fraction"] = round(worst["unexplained_max"], 4)
        record["permutation_last_flow_unexplained_fraction"] = round(
            max(r["last_unexplained"] for r in faithful), 4)
        record["permutation_slow_unexplained_fraction"] = round(
            max(r["slow_unexplained"] for r in faithful), 4)
        print(f"largest unexplained share of a flow's time, ECMP with PFC: "
              f"{worst['unexplained_max']:.1%} (goal <= 5 %; {worst['worst_flow']}, seed "
              f"{worst['seed']}; {worst['folder'] if args.keep else 'run with --keep'}); of "
              f"a flow slower than its causes explain, at most "
              f"{record['permutation_slow_unexplained_fraction']:.1%}; of the flow that ended "
              f"last, which set the JCT, at most "
              f"{record['permutation_last_flow_unexplained_fraction']:.1%}. A switch port is a "
              "FIFO, not a max-min scheduler: a flow can take more or less than its max-min "
              "share of a link it shares (the deep-queue runs, without PFC, show it alone)")
    record.update(rate_auto("bench_permutation", [r["fidelity"] for r in runs]))
    update_bench_json(Path(args.out), record)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
