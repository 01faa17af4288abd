#!/usr/bin/env python3
"""Benchmark: how many ranks this machine emulates faithfully, and the CPU per packet.

Ring all-reduce on a one-tier non-blocking fabric (one switch plane) at 100 Mbit/s per
link, for each rank count given (8, 12, 16, 24, 32, 48 by default), RoCE, static ECMP,
one agent process per core (traffic.host), on both engines of the agents' per-packet
code side by side, one size after the other: interpreted (AFT_ENGINE=interpreted, the
.py files) and compiled (the Cython extensions, docs/compiled.md). Per size and engine:
JCT over the ideal 2(n-1)/n x S / B, the run's fidelity verdict, the highest rate this
machine's calibration predicts the size stays faithful at (what --rate auto goes by: a
cross-check of the calibration against the verdict), JCT over physics' floor
(testbed.expect.ring_floor_s: headers and one switch's store-and-forward per step;
1.030x ideal at 8 ranks, 1.046 at 16, 1.078 at 32 for 2 MiB at 100 Mbit/s), and the CPU
the whole machine spent per delivered data packet while the workload ran (every process
of the run plus kernel time: the machine's CPU load x cores x the workload's duration,
over the unique data packets the receivers delivered). Merges into results/bench.json,
from the compiled engine, the interpreted one's beside with _before:
allreduce_max_faithful_ranks_100mbps (the largest size whose JCT is within 1.05x of
physics' floor for that size and whose verdict is faithful; 0 if none; goal: at least
twice the interpreted engine's),
cpu_us_per_packet (at 16 ranks, or the nearest size run; null where that workload was
shorter than 2 of the CPU sampler's periods, too short for /proc/stat's ticks) and their
ratio cpu_us_per_packet_over_before, and allreduce{n}_scale_jct_over_ideal / _fidelity per
size. The machine is shared: CPU per packet counts whatever else ran meanwhile too.

    sudo .venv/bin/python scripts/bench_scale.py [--ranks 8 16 32] [--engines compiled]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

from testbed.benchmarks import machine_line, update_bench_json
from testbed.expect import ring_floor_s
from testbed.experiment import finite_float, from_toml
from testbed.run import run
from testbed.script_args import add_rate
from traffic.engine import COMPILED, INTERPRETED, engine_env
from traffic.transport import packet_count

ROOT = Path(__file__).resolve().parent.parent

# A size counts when its JCT is within this of physics' floor for that size and its verdict
# is faithful. The floor, not the ideal: at 48 ranks store-and-forward alone puts the
# floor past 1.10x ideal, so a bar on the ideal fails a perfect emulation there.
FAITHFUL_JCT_OVER_FLOOR = 1.05
CPU_SAMPLES = 2     # the CPU sampler's periods a workload must span for its CPU to count


def run_cpu_s(m: dict) -> float | None:
    """The CPU seconds the machine spent on the run while its workload ran (load less
    steal, x cores, x the workload's duration), or None where the workload was shorter
    than CPU_SAMPLES of the sampler's periods: /proc/stat counts in 10 ms ticks and the
    sampler reads it every period_s, so a 30 ms workload's few milliseconds of CPU read
    as anything from 0 to twice their value; 0.5 s on 2 cores is 100 ticks."""
    t0, t1 = m.get("workload_window_s") or (0.0, 0.0)
    cpu = m["cpu"]
    if t1 - t0 < CPU_SAMPLES * cpu.get("period_s", 0.25):
        return None
    return cpu["work_mean_percent"] / 100 * cpu["cores"] * (t1 - t0)
ENGINES = (INTERPRETED, COMPILED)
SUFFIX = {COMPILED: "", INTERPRETED: "_before"}


def measure(ranks: int, args, base: str, engine: str = COMPILED) -> dict:
    exp = from_toml(None, {
        "name": f"bench_scale{ranks}_{engine}", "workload": "allreduce",
        "message_bytes": args.message_bytes, "iterations": args.iterations,
        "transport": "roce", "entropy": "ecmp", "results_dir": base, "timeout_s": 600.0,
        "rto_ms": 200.0,
        "topology": {"name": f"nonblocking{ranks}", "kind": "one_tier",
                     "params": {"nodes": ranks, "planes": 1, "rate_mbps": args.rate_mbps}}})
    with engine_env(engine):            # the agents inherit it
        folder, m = run(exp, progress=lambda s: print(f"  {s}", file=sys.stderr))
    if m.get("engine") != engine:
        raise RuntimeError(f"the {engine} run's agents ran {m.get('engine')}")
    with open(folder / "flows.csv") as fh:
        packets = sum(packet_count(int(f["size_bytes"]), exp.payload_bytes)
                      for f in csv.DictReader(fh) if f["role"] == "recv" and f["end_ns"])
    cpu_s = run_cpu_s(m)      # the run's CPU, not the hypervisor's steal
    return {"jct_over_ideal": m["jct_over_ideal"], "fidelity": m["fidelity"]["verdict"],
            # the run's own check of its rate against the calibration (None: none cached)
            "calibrated_max_mbps": (m["rate_check"] or {}).get("max_faithful_mbps"),
            # physics' floor on this one-tier fabric: one switch on every path
            "jct_over_floor": m["jct_mean_s"] / ring_floor_s(
                ranks, args.message_bytes, args.rate_mbps, exp.payload_bytes),
            "reasons": m["fidelity"]["reasons"], "cpu_percent": m["cpu"]["cpu_mean_percent"],
            "steal_percent": m["cpu"]["steal_mean_percent"],
            # wire time the kernel's late shaping timers cost (testbed.kernel_timers)
            "timers_lost": m["fidelity"]["figures"].get("shaping_lost_fraction"),
            # the busiest agent process's CPU over its workload, a share of one core
            "process_busy": m["fidelity"]["figures"].get("process_busy_max"),
            "packets": packets,
            "us_per_packet": 1e6 * cpu_s / packets if packets and cpu_s is not None else None}


def largest_faithful(rows: dict[int, dict]) -> int:
    """The largest size (ranks) whose run was faithful and within FAITHFUL_JCT_OVER_FLOOR
    of physics' floor for that size; 0 if none."""
    return max((n for n, r in rows.items() if r["fidelity"] == "faithful"
                and r["jct_over_floor"] <= FAITHFUL_JCT_OVER_FLOOR), default=0)


def _us(per: float | None) -> str:
    return (f"{per} us" if per is not None else
            f"n/a (a workload shorter than {CPU_SAMPLES} CPU samples)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 12, 16, 24, 32, 48])
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    add_rate(ap, type=finite_float, default=100.0)
    ap.add_argument("--message-bytes", type=int, default=2 << 20, help="bytes per rank")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    ap.add_argument("--keep", action="store_true", help="keep the runs' results folders")
    args = ap.parse_args(argv)
    base = str(ROOT / "results") if args.keep else tempfile.mkdtemp(prefix="aft-bench-")
    print(f"# ring all-reduce, one-tier, {args.rate_mbps:g} Mbit/s, {args.message_bytes} B "
          f"per rank, {args.iterations} iterations; {machine_line()}")
    print("# physics: floor = 2(n-1) steps x (chunk + headers + one switch's store-and-"
          "forward of a frame) / B (testbed.expect.ring_floor_s; the alpha-beta model, "
          "Patarasuk & Yuan 2009): the least JCT any network gives")
    print("# CPU %: the machine's load, the hypervisor's steal included (steal %: the host "
          "ran something else); us/packet: the run's own CPU (load less steal) per packet")
    print("# timers lost: the shaped ports' wire time lost to their timers firing later "
          "than the burst (testbed.kernel_timers), % of their busy time")
    print("# proc busy: the busiest agent process's CPU over its workload, % of its one core "
          "(one thread: near 100 % it sets the pace)")
    print("# calibrated: the highest rate at which this machine's calibration says the size "
          "stays faithful (testbed.rate.predict, what --rate auto picks from)")
    print(f"# {'ranks':>5s} {'engine':>11s} {'JCT/ideal':>9s} {'floor/ideal':>11s} "
          f"{'JCT/floor':>9s} {'CPU %':>6s} {'steal %':>7s} {'proc busy':>9s} {'timers lost':>11s} "
          f"{'us/packet':>9s} "
          f"{'calibrated':>10s}  fidelity")
    rows: dict[str, dict[int, dict]] = {e: {} for e in args.engines}
    for n in sorted(args.ranks):
        for engine in args.engines:       # side by side: the same minute of the machine
            r = rows[engine][n] = measure(n, args, base, engine)
            per = "n/a" if r["us_per_packet"] is None else f"{r['us_per_packet']:.1f}"
            lost = "n/a" if r["timers_lost"] is None else f"{100 * r['timers_lost']:.1f} %"
            busy = "n/a" if r["process_busy"] is None else f"{100 * r['process_busy']:.0f} %"
            cal = ("n/a" if r["calibrated_max_mbps"] is None
                   else f"{r['calibrated_max_mbps']:g} Mb/s")
            print(f"  {n:5d} {engine:>11s} {r['jct_over_ideal']:9.3f} "
                  f"{r['jct_over_ideal'] / r['jct_over_floor']:11.3f} "
                  f"{r['jct_over_floor']:9.3f} {r['cpu_percent']:6.1f} "
                  f"{r['steal_percent'] or 0.0:7.1f} {busy:>9s} {lost:>11s} {per:>9s} {cal:>10s}  "
                  f"{r['fidelity']}"
                  + (f" ({'; '.join(r['reasons'])})" if r["reasons"] else ""), flush=True)
    main_engine = COMPILED if COMPILED in rows else args.engines[0]
    at = min(rows[main_engine], key=lambda n: abs(n - 16))
    name = ("allreduce_max_faithful_ranks_100mbps" if args.rate_mbps == 100 else
            f"allreduce_max_faithful_ranks_{args.rate_mbps:g}mbps")
    record = {"cpu_us_per_packet_ranks": at, "cpu_us_per_packet_engine": main_engine}
    for eng, got in rows.items():
        suffix = SUFFIX[eng]
        record[name + suffix] = largest_faithful(got)
        per = got[at]["us_per_packet"]          # None: too short to measure
        record["cpu_us_per_packet" + suffix] = None if per is None else round(per, 2)
        for n, r in got.items():
            record[f"allreduce{n}_scale_jct_over_ideal{suffix}"] = round(r["jct_over_ideal"], 4)
            record[f"allreduce{n}_scale_fidelity{suffix}"] = r["fidelity"]
            record[f"allreduce{n}_scale_jct_over_floor{suffix}"] = round(r["jct_over_floor"], 4)
            record[f"allreduce{n}_scale_timers_lost{suffix}"] = r["timers_lost"]
            record[f"allreduce{n}_scale_process_busy{suffix}"] = r["process_busy"]
            if suffix == "":
                record[f"allreduce{n}_scale_calibrated_max_mbps"] = r["calibrated_max_mbps"]
    line = (f"largest faithful all-reduce within {FAITHFUL_JCT_OVER_FLOOR}x physics' floor: "
            + ", ".join(f"{e} {record[name + SUFFIX[e]] or 'none'}" for e in rows)
            + f" ranks; CPU per delivered packet at {at} ranks: "
            + ", ".join(f"{e} {_us(record['cpu_us_per_packet' + SUFFIX[e]])}" for e in rows))
    if len(rows) == len(ENGINES):
        if record["cpu_us_per_packet_before"] and record["cpu_us_per_packet"] is not None:
            record["cpu_us_per_packet_over_before"] = round(
                record["cpu_us_per_packet"] / record["cpu_us_per_packet_before"], 3)
            line += f" (ratio {record['cpu_us_per_packet_over_before']})"
        line += (f"; goal: the compiled engine's faithful ranks at least twice the "
                 f"interpreted one's ({record[name]} vs 2 x {record[name + '_before']}: "
                 f"{'met' if record[name] >= 2 * record[name + '_before'] > 0 else 'NOT met'})")
    print(line)
    update_bench_json(Path(args.out), record)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
