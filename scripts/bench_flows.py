#!/usr/bin/env python3
"""Benchmark: how many open-loop flows per second this machine carries faithfully.

Thousands of short flows cost per flow, not only per packet: a step, its timers, an ACK
for every short flow, a results row. On a leaf-spine of 8 hosts at 100 Mbit/s, open-loop
flows of 1000 B (one packet each, a CDF with one atom) arrive at a ladder of aggregate
rates (`--rates`, flows per second over the 8 senders); each rung is one run of about
1.5 s of arrivals (at most testbed.attribution.MAX_FLOWS flows). A rung is carried when
the agents keep up with the arrivals: the arrival rate produced is within 10 % of the
rate asked, the flows started after their instants by less than one sender's mean gap
at p99 (else they bunch and the load is not what was asked), and the run's timer lag
p99 is within its faithful limit. The run's own verdict is printed beside: it also
grades the wire an agent left idle against the ports' busy time, which for one-packet
flows is mostly the start of each flow (the agents' interrupt moderation and wake-ups),
a fixed latency per flow rather than a machine falling behind (docs/flows.md).

flows_per_second_faithful is the highest such rung, beside the machine's calibration.
What one flow costs beyond its packet, in packets' worth of CPU (the ratio testbed.rate's
FLOW_COST_PACKETS prices open-loop runs with), lies between what the last faithful rung
and the first unfaithful one imply at the calibration's budget:
UTILIZATION x budget_pps / rate - packets per flow. Merges into results/bench.json:
flows_per_second_faithful, flows_first_unfaithful_per_s, flow_cost_packets_low and
_high, flow_cost_packets_priced (the constant --rate auto uses), and
flows_bench_rungs (every rung: rate, verdict, produced/asked, late p99, CPU).

    sudo .venv/bin/python scripts/bench_flows.py [--rates 250,500,1000,2000,4000,8000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from testbed.attribution import MAX_FLOWS
from testbed.benchmarks import machine_line, update_bench_json
from testbed.experiment import from_toml
from testbed.rate import FLOW_COST_PACKETS, UTILIZATION
from testbed.run import ensure_calibration, run

ROOT = Path(__file__).resolve().parent.parent
HOSTS = 8
LINK_MBPS = 100.0
FLOW_BYTES = 1000
ARRIVALS_S = 1.5             # seconds of arrivals per rung
ATOM = f"# every flow {FLOW_BYTES} B\n0 0\n{FLOW_BYTES} 0\n{FLOW_BYTES} 100\n"


def rung(tmp: Path, cdf: Path, rate_per_s: float) -> dict:
    """One run at `rate_per_s` flows per second over the senders; its figures."""
    load = rate_per_s / HOSTS * FLOW_BYTES * 8 / (LINK_MBPS * 1e6)
    # at most what the flows' time split takes (testbed.attribution), so each has its slowdown
    count = min(MAX_FLOWS, max(100, round(rate_per_s * ARRIVALS_S)))
    folder, m = run(from_toml(None, {
        "name": f"bench_flows_{rate_per_s:g}", "workload": "flows", "iterations": 1,
        "flow_sizes": str(cdf), "flow_load": load, "flow_count": count,
        "results_dir": str(tmp), "timeout_s": 300.0, "rto_ms": 200.0,
        "topology": {"kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 2, "hosts_per_leaf": HOSTS // 2,
            "rate_mbps": LINK_MBPS, "uplink_rate_mbps": LINK_MBPS * 2}}}))
    ol = m["open_loop"]
    produced = (ol["arrival_rate_per_s"] or 0.0) / ol["arrival_rate_asked_per_s"]
    gap_s = HOSTS / rate_per_s
    late = ol["start_late_p99_s"]
    verdict = m["fidelity"]["verdict"]
    fig = m["fidelity"]["figures"]
    lag_ok = m["fidelity"]["grades"].get("timer_lag_p99_ms") == "faithful"
    ok = abs(produced - 1) <= 0.10 and late is not None and late < gap_s and lag_ok
    return {"rate_per_s": rate_per_s, "verdict": verdict, "flows": count,
            "starved_fraction": fig.get("starved_fraction"),
            "timer_lag_p99_ms": fig.get("timer_lag_p99_ms"),
            "produced_over_asked": round(produced, 3), "late_p99_s": late,
            "gap_s": gap_s, "cpu_mean_percent": m["cpu"]["cpu_mean_percent"],
            "slowdown_p50": None if ol["slowdown_p50"] is None else round(ol["slowdown_p50"], 2),
            "faithful": ok}


def rates_arg(text: str) -> list[float]:
    """--rates: positive numbers, ascending; ValueError naming what is wrong."""
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of numbers") from None
    if not rates or any(not r > 0 for r in rates) or rates != sorted(rates):
        raise ValueError(f"{text!r}: rates must be positive and ascending")
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="250,500,1000,2000,4000,8000",
                    help="aggregate flows per second, ascending")
    ap.add_argument("--bench", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args()
    try:
        rates = rates_arg(args.rates)
    except ValueError as exc:
        print(f"error: --rates: {exc}", file=sys.stderr)
        return 2
    cal = ensure_calibration(print)
    print(machine_line())
    rungs = []
    with tempfile.TemporaryDirectory(prefix="aft-bench-flows-") as tmp:
        cdf = Path(tmp) / "atom.cdf"
        cdf.write_text(ATOM)
        for rate in rates:
            r = rung(Path(tmp), cdf, rate)
            rungs.append(r)
            print(f"  {rate:>7g} flows/s: verdict {r['verdict']} (starved "
                  f"{r['starved_fraction']} of busy time, timer lag p99 "
                  f"{r['timer_lag_p99_ms']} ms), produced/asked "
                  f"{r['produced_over_asked']}, started late p99 {r['late_p99_s']:.4f} s "
                  f"(a sender's mean gap {r['gap_s']:.4f} s), CPU {r['cpu_mean_percent']} %, "
                  f"slowdown p50 {r['slowdown_p50']}: "
                  f"{'carried' if r['faithful'] else 'NOT carried'}")
            if not r["faithful"]:
                break
    carried = [r["rate_per_s"] for r in rungs if r["faithful"]]
    failed = [r["rate_per_s"] for r in rungs if not r["faithful"]]
    budget = UTILIZATION * cal["budget_pps_direct"]
    packets = 1.0
    figures = {"flows_per_second_faithful": max(carried) if carried else 0.0,
               "flows_first_unfaithful_per_s": min(failed) if failed else None,
               "flow_cost_packets_high": round(budget / max(carried) - packets, 2)
               if carried else None,
               "flow_cost_packets_low": round(budget / min(failed) - packets, 2)
               if failed else None,
               "flow_cost_packets_priced": FLOW_COST_PACKETS,
               "flows_bench_rungs": rungs}
    print(f"flows_per_second_faithful {figures['flows_per_second_faithful']:g} (first not "
          f"carried: {figures['flows_first_unfaithful_per_s']}); one flow costs "
          f"{figures['flow_cost_packets_low']} to {figures['flow_cost_packets_high']} "
          f"packets' worth beyond its packet at this calibration ({cal['budget_pps_direct']} "
          f"packets/s); --rate auto prices {FLOW_COST_PACKETS:g}")
    update_bench_json(args.bench, figures)
    print(f"merged into {args.bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
