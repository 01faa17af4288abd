#!/usr/bin/env python3
"""Benchmark: DCQCN on an 8:1 incast, its senders' fairness and the queue it keeps.

Nine nodes on one non-blocking switch (one-tier, one plane), eight sending to the ninth,
RoCE over PFC (the lossless class; 1 MiB port buffers, so the headroom fits), ECN marking
at the switch (kmin 16 KiB, kmax 64 KiB, pmax 0.2). The same incast runs twice, side by
side: without congestion control and with DCQCN (the paper's parameters; scale factor
400: 100 Mbit/s for its 40 Gb/s ports). Per run: Jain's fairness of the senders' goodput
(size / flow completion time), the receiver's port queue averaged over the incast
(bytes / kmax), pause frames, CNPs, JCT / ideal, and the run's fidelity verdict. Goals
(the congestion-control issue): Jain >= 0.95 and queue / kmax <= 1.0 with DCQCN, both
from a faithful run. Merges into results/bench.json: dcqcn_incast_jain,
dcqcn_incast_queue_over_kmax, dcqcn_incast_fidelity, dcqcn_incast_jct_over_ideal, the
same for nocc_incast_*, and the machine's calibration; dcqcn_incast_cc_share, the
share of the receiver's link DCQCN's own rates left the senders (1 / share is the JCT /
ideal those rates alone predict, printed beside the measured); and
dcqcn_incast_model_jct_over_ideal, what the paper's parameters give at the paper's own
40 Gb/s for the same bytes (testbed.dcqcn_model), with dcqcn_incast_jct_over_model, the
measured over it (goal: within 10 %).

    sudo .venv/bin/python scripts/bench_dcqcn.py [--message-bytes 4000000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

from testbed.benchmarks import machine_line, update_bench_json
from testbed.cc_results import jain, port_queue
from testbed.dcqcn_model import incast
from testbed.experiment import from_toml, positive_float
from testbed.run import run
from testbed.script_args import add_rate

ROOT = Path(__file__).resolve().parent.parent

SENDERS = 8


def measure(cc: str, args, base: str) -> dict:
    exp = from_toml(None, {
        "name": f"bench_incast_{cc}", "workload": "incast", "message_bytes": args.message_bytes,
        "iterations": 1, "transport": "roce", "pfc": "on", "ecn": "on", "cc": cc,
        "results_dir": base, "timeout_s": 600.0, "rto_ms": 200.0, "seed": args.seed,
        "rate": args.rate_mbps,
        "topology": {"name": "incast9", "kind": "one_tier", "scale_factor": 400.0,
                     "params": {"nodes": SENDERS + 1, "planes": 1,
                                "queue_bytes": args.queue_bytes}}})
    topo = exp.resolve_topology()
    receiver = f"cpu{SENDERS}"
    folder, m = run(exp, progress=lambda s: print(f"  {s}", file=sys.stderr))
    with open(folder / "flows.csv") as fh:
        sends = [f for f in csv.DictReader(fh) if f["role"] == "send"]
    report = json.loads((folder / "pfc.json").read_text())
    t0 = report["t0_monotonic_s"]
    _, queue = port_queue(folder, "plane0", topo.ifname("plane0", receiver),
                          min(int(f["start_ns"]) for f in sends) / 1e9 - t0,
                          max(int(f["end_ns"]) for f in sends) / 1e9 - t0)
    return {"jain": jain([float(f["goodput_mbps"]) for f in sends]),
            "queue_over_kmax": queue / exp.ecn_kmax_bytes,
            "jct_over_ideal": m["jct_over_ideal"], "pause_frames":
            report["totals"]["frames_sent"], "drops": report["totals"]["drops"],
            "cnps": (m.get("cc") or {}).get("cnps_sent", 0),
            # the share of the receiver's link DCQCN's rates left the senders (cc_results)
            "cc_share": ((m.get("cc") or {}).get("held") or {}).get("allowed_fraction"),
            "fidelity": m["fidelity"]["verdict"], "folder": str(folder)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--message-bytes", type=int, default=4_000_000, help="bytes per sender")
    ap.add_argument("--queue-bytes", type=int, default=1 << 20, help="switch port buffer")
    add_rate(ap, type=positive_float, default=100.0,
             help="emulated link rate; the scale factor follows (400 x 100 / rate), "
             "so every rate stands for the paper's 40 Gb/s ports")
    ap.add_argument("--rounds", type=int, default=1, help="side-by-side pairs of runs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    ap.add_argument("--keep", action="store_true", help="keep the runs' results folders")
    args = ap.parse_args(argv)
    base = str(ROOT / "results") if args.keep else tempfile.mkdtemp(prefix="aft-bench-")
    print(f"# {SENDERS}:1 incast, one switch, PFC + ECN, {args.message_bytes} B per sender, "
          f"{args.rate_mbps:g} Mbit/s links (x{400 * 100 / args.rate_mbps:g}: 40 Gb/s); "
          f"{machine_line()}")
    print(f"# {'round':>5s} {'cc':>6s} {'Jain':>6s} {'queue/kmax':>10s} {'JCT/ideal':>9s} "
          f"{'pauses':>6s} {'CNPs':>5s} {'drops':>5s} {'cc share':>8s} {'1/share':>7s}  "
          "fidelity")
    runs: dict[str, list[dict]] = {"none": [], "dcqcn": []}
    for k in range(args.rounds):
        for cc in ("none", "dcqcn"):
            r = measure(cc, args, base)
            runs[cc].append(r)
            share = r["cc_share"]
            print(f"  {k + 1:5d} {cc:>6s} {r['jain']:6.3f} {r['queue_over_kmax']:10.2f} "
                  f"{r['jct_over_ideal']:9.3f} {r['pause_frames']:6d} {r['cnps']:5d} "
                  f"{r['drops']:5d} {'-' if share is None else f'{share:8.3f}':>8s} "
                  f"{'-' if not share else f'{1 / share:7.3f}':>7s}  {r['fidelity']}")
    record = {}
    for cc, name in (("dcqcn", "dcqcn"), ("none", "nocc")):
        faithful = [r for r in runs[cc] if r["fidelity"] == "faithful"] or runs[cc]
        for key in ("jain", "queue_over_kmax", "jct_over_ideal"):
            values = [r[key] for r in faithful]
            record[f"{name}_incast_{key}"] = round(min(values) if key == "jain"
                                                   else max(values), 4)
        record[f"{name}_incast_fidelity"] = ("faithful" if all(
            r["fidelity"] == "faithful" for r in runs[cc]) else
            ", ".join(r["fidelity"] for r in runs[cc]))
    shares = [r["cc_share"] for r in runs["dcqcn"] if r["cc_share"]]
    if shares:
        record["dcqcn_incast_cc_share"] = round(min(shares), 4)
        print(f"DCQCN's own rates left the senders {min(shares):.1%}-{max(shares):.1%} of the "
              "receiver's link while they sent: alone that predicts JCT/ideal "
              f"{1 / max(shares):.3g}-{1 / min(shares):.3g}; measured "
              f"{min(r['jct_over_ideal'] for r in runs['dcqcn']):.3g}-"
              f"{max(r['jct_over_ideal'] for r in runs['dcqcn']):.3g}")
    # the paper's parameters at the paper's rate, the same bytes (testbed.dcqcn_model)
    model = incast(SENDERS, args.message_bytes, 40.0, seed=args.seed)   # the runs' marking
    longer = incast(SENDERS, 10 * args.message_bytes, 40.0, seed=args.seed)
    measured = [r["jct_over_ideal"] for r in runs["dcqcn"]]
    record["dcqcn_incast_model_jct_over_ideal"] = round(model["jct_over_ideal"], 4)
    record["dcqcn_incast_jct_over_model"] = round(max(measured) / model["jct_over_ideal"], 4)
    print(f"expected: DCQCN with the paper's parameters at the paper's 40 Gb/s, the same "
          f"{SENDERS} x {args.message_bytes} B ({model['ideal_us'] / 1e3:.2f} ms at line rate; "
          f"testbed.dcqcn_model, the agents' own reaction point): JCT/ideal "
          f"{model['jct_over_ideal']:.3f}, lowest rate {model['lowest_rate_fraction']:.1%} of "
          f"line; measured {min(measured):.3f}-{max(measured):.3f}: "
          f"{'agree' if abs(max(measured) / model['jct_over_ideal'] - 1) <= 0.1 else 'DISAGREE'}"
          " within 10 % (additive increase, R_AI = 0.1 % of line per 55 us timer, wins a cut "
          "back in about the incast's own length; the same model gives "
          f"{longer['jct_over_ideal']:.3f} for flows ten times longer)")
    print(f"DCQCN: Jain {record['dcqcn_incast_jain']} (goal >= 0.95), queue / kmax "
          f"{record['dcqcn_incast_queue_over_kmax']} (goal <= 1.0); without congestion "
          f"control: {record['nocc_incast_jain']}, {record['nocc_incast_queue_over_kmax']} "
          "(worst of the faithful runs)")
    update_bench_json(Path(args.out), record)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
