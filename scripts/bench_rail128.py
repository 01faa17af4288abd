#!/usr/bin/env python3
"""Benchmark: ring all-reduce over all 128 GPUs of the rail-optimized fabric, at the rate
this machine's calibration picks.

topologies/rail128.toml (16 servers x 8 GPUs, 8 rail leaves, 4 spines, an NVLink domain
per server), every GPU a rank, RoCE, static ECMP, `rate = "auto"`: every link scaled by
one factor to the highest rate of the ladder at which the calibration says the ring
stays faithful (testbed.rate; the cached calibration, or a new one first). The ring is
NCCL's on a rail fabric (`ring_order = "rails"`: every hop between servers stays on one
rail), 32 MiB per rank: physics' floor (testbed.expect.ring_floor_s on the ring's own
path, ring_path) is then 1.03x the ideal. In the endpoints' listed order the 16 hops
between servers all cross from rail 7 to rail 0 through the spines, and static ECMP
collides them at every step: measured 1.43x ideal with 304 drops, faithfully (the
network, not the emulator); and with 4 MiB per rank (8 packets a step) the floor alone
is 1.20x. Measured JCT against the ideal 2(n-1)/n x S / B at the rate chosen and
against the floor, and the run's own fidelity verdict. Merges into results/bench.json:
rail128_allreduce_jct_over_ideal, rail128_allreduce_fidelity, rail128_allreduce_rate_mbps
(the rate chosen), rail128_allreduce_predicted_max_mbps (the calibration's limit), and
rail128_allreduce_cpu_mean_percent. Goal: <= 1.10 and faithful. When the calibration
says even the lowest rate of the ladder is too much for this machine, nothing is built:
the figures say so (fidelity "refused", the predicted limit beside it), and `--ranks N`
runs the first N GPUs instead.

    sudo .venv/bin/python scripts/bench_rail128.py [--ranks N] [--message-bytes N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from testbed.benchmarks import machine_line, update_bench_json
from testbed.expect import ring_floor_s, ring_path
from testbed.experiment import from_toml
from testbed.rate import MIN_RATE_MBPS, predict
from testbed.run import ensure_calibration, pick_ranks, run
from traffic.workloads import ideal_time_s

ROOT = Path(__file__).resolve().parent.parent

FAITHFUL_JCT = 1.10


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="rail128", help="topology file or name")
    ap.add_argument("--message-bytes", type=int, default=32 << 20, help="bytes per rank")
    ap.add_argument("--ring-order", choices=("rails", "listed"), default="rails")
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=None, help="the first N GPUs (default: all)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    ap.add_argument("--keep", action="store_true", help="keep the run's results folder")
    args = ap.parse_args(argv)
    base = str(ROOT / "results") if args.keep else tempfile.mkdtemp(prefix="aft-bench-")
    cal = ensure_calibration(progress=lambda s: print(f"  {s}", file=sys.stderr))   # cached, or now
    exp = from_toml(None, {
        "name": f"bench_{Path(args.topology).stem}_allreduce", "workload": "allreduce",
        "message_bytes": args.message_bytes, "iterations": args.iterations,
        "transport": "roce", "entropy": "ecmp", "rate": "auto", "results_dir": base,
        "timeout_s": 1800.0, "rto_ms": 200.0, "topology": args.topology, "ranks": args.ranks,
        "ring_order": args.ring_order})
    topo = exp.resolve_topology()
    exp.check_against(topo)
    ranks = pick_ranks(exp, topo)
    rate_mbps, frames = ring_path(topo, ranks)
    floor = ring_floor_s(len(ranks), args.message_bytes, rate_mbps, exp.payload_bytes,
                         frames) / ideal_time_s("allreduce", len(ranks), args.message_bytes,
                                                rate_mbps)
    print(f"# ring all-reduce on {args.topology}, {len(ranks)} GPUs, {args.message_bytes} B "
          f"per rank, {args.iterations} iteration(s), ring order {args.ring_order}, rate "
          f"auto; {machine_line()}")
    print(f"# physics: floor = 2(n-1) steps x (chunk + headers + {frames:g} frame times of "
          f"store-and-forward on the ring's slowest path) / B = {floor:.3f}x ideal "
          "(testbed.expect.ring_floor_s; the alpha-beta model, Patarasuk & Yuan 2009)")
    # what run() decides first, here so that a refusal is a figure, not an error
    limit = predict(cal, exp, topo, ranks, None)["max_faithful_mbps"]
    if limit < MIN_RATE_MBPS:
        print(f"  refused before building: this machine should carry this ring faithfully "
              f"at {limit:g} Mbit/s per link at most, below the lowest sensible "
              f"{MIN_RATE_MBPS} Mbit/s (try --ranks)")
        update_bench_json(Path(args.out), {
            "rail128_allreduce_fidelity": "refused", "rail128_allreduce_ranks": len(ranks),
            "rail128_allreduce_predicted_max_mbps": limit})
        print(f"goal (<= {FAITHFUL_JCT}x ideal and faithful): not met; recorded in {args.out}")
        return 0
    folder, m = run(exp, progress=lambda s: print(f"  {s}", file=sys.stderr))
    rate = m.get("rate_choice") or {}
    verdict = m["fidelity"]["verdict"]
    record = {"rail128_allreduce_jct_over_ideal": round(m["jct_over_ideal"], 4),
              "rail128_allreduce_fidelity": verdict,
              "rail128_allreduce_rate_mbps": rate.get("rate_mbps"),
              "rail128_allreduce_predicted_max_mbps": rate.get("max_faithful_mbps"),
              "rail128_allreduce_cpu_mean_percent": m["cpu"]["cpu_mean_percent"],
              "rail128_allreduce_ranks": m.get("ranks"),
              "rail128_allreduce_floor_over_ideal": round(floor, 4),
              "rail128_allreduce_jct_over_floor": round(m["jct_over_ideal"] / floor, 4),
              "rail128_allreduce_ring_order": args.ring_order,
              "rail128_allreduce_message_bytes": args.message_bytes}
    ok = verdict == "faithful" and m["jct_over_ideal"] <= FAITHFUL_JCT
    print(f"  rate chosen {rate.get('rate_mbps')} Mbit/s (calibration: faithful up to "
          f"{rate.get('max_faithful_mbps')}); JCT {m['jct_mean_s']:.3f} s, ideal "
          f"{m['ideal_s']:.3f} s: {m['jct_over_ideal']:.3f}x (physics' floor {floor:.3f}x, "
          f"JCT/floor {m['jct_over_ideal'] / floor:.3f}); CPU "
          f"{m['cpu']['cpu_mean_percent']:.0f}%; {verdict}"
          + (f" ({'; '.join(m['fidelity']['reasons'])})" if m["fidelity"]["reasons"] else ""))
    if m["jct_over_ideal"] < floor:
        print("  below physics' floor: each port that idled between steps sends its HTB "
              "burst (2 jumbo frames, 18 kB) above the link rate, a share of a chunk that "
              "grows as chunks shrink (fabric.shaping)")
    print(f"goal (<= {FAITHFUL_JCT}x ideal and faithful): {'met' if ok else 'not met'}; "
          f"results: {folder}")
    update_bench_json(Path(args.out), record)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
