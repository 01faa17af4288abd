"""Calibration: this machine's packet budget, measured with the real agents and real
kernel forwarding, cached per machine with its date (the model that uses it: testbed.rate).

    one_hop:     one_tier(8)                 agent -> switch -> agent            1 switch hop
    three_hops:  leaf_spine(8 x 1 x 1 host)   agent -> leaf -> spine -> leaf -> agent  3 hops
    each: 8 flows, every endpoint sending one and receiving one, at 100 Mbit/s per link:
    paced by the links, as an experiment is, not flat out, at a load like an
    experiment's (a third to two thirds of the machine here); the machine's time per
    delivered data packet = its CPU load x the workload's duration / the packets;
    each run 3 times, interleaved, and the median run kept (one run's load varied
    28-46 % from run to run on a quiet machine; ~25 s in all)

Paced, because that is what an experiment costs: a link at its rate sends one frame per
frame time, so every frame takes its own qdisc timer at every shaped hop and its agents
handle a few packets per wake-up. Two elephants flat out on 10 Gbit/s links (this
module's first runs) cost 2.9 us of the machine per packet; the same agents paced at
100 Mbit/s, 16-22 us: a rate picked from the flat-out figure was 4-8 times what the
machine could carry faithfully. From the two runs: the cost of a packet, a + b per
switch hop (b = half the difference of the two; a = the one-hop cost less b). A run
the machine could not keep up with still measures it: saturated, its time per packet
is what a packet costs at full load (other load on a shared machine counts too, which
errs on the safe side: a lower rate).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from testbed.experiment import Experiment
from testbed.rate import (
    CACHE,
    MAX_AGE_S,
    MODEL,
    UTILIZATION,
    common_rate,
    load_cached,
    machine_key,
)
from testbed.run import RunFailedError, run
from traffic.engine import engine_name

CALIBRATION_MBPS = 100.0
CALIBRATION_BYTES = 16 << 20          # per flow: 4096 packets of 4 KiB, 1.3 s at 100 Mbit/s
REPEATS = 3                           # runs of each, interleaved; the median one is kept
RUNS = {  # name -> (switch hops, topology, flows)
    "one_hop": (1, {"kind": "one_tier", "params": {"nodes": 8, "planes": 1}},
                [f"cpu{k}>cpu{(k + 4) % 8}" for k in range(8)]),
    # a leaf per host: no two flows share a link, as in one_hop (4 hosts per leaf
    # would oversubscribe the uplinks 4:1, an incast instead of a cost)
    "three_hops": (3, {"kind": "leaf_spine", "params": {"leaves": 8, "spines": 1,
                                                        "hosts_per_leaf": 1}},
                   [f"l{k}h0>l{(k + 4) % 8}h0" for k in range(8)]),
}


class CalibrationError(RuntimeError):
    """The calibration runs did not give a budget (they failed, or were unfaithful)."""


def _measure(name: str, hops: int, topo: dict, pairs: list[str], tmp: Path) -> dict:
    """One calibration run: the machine's own time per delivered data packet."""
    topo = {**topo, "params": {**topo["params"], "rate_mbps": CALIBRATION_MBPS}}
    exp = Experiment(name=f"calibrate_{name}", workload="p2p", pairs=pairs,
                     message_bytes=CALIBRATION_BYTES, iterations=1, topology=topo,
                     results_dir=str(tmp), timeout_s=60.0).validate()
    try:
        _, m = run(exp)
    except RunFailedError as exc:
        raise CalibrationError(f"calibration run {name!r} failed: {exc}") from None
    packets = m["flows"]["bytes_delivered"] / exp.payload_bytes
    t0, t1 = m.get("workload_window_s") or (0.0, m["jct_mean_s"])
    # of the whole machine, its own work: not what the hypervisor stole
    busy = m["cpu"]["work_mean_percent"] / 100 * (t1 - t0)
    return {"switch_hops": hops, "packets": round(packets),
            "job_s": m["jct_mean_s"], "pps": packets / m["jct_mean_s"],
            "cpu_mean_percent": m["cpu"]["cpu_mean_percent"],
            "steal_percent": m["cpu"].get("steal_mean_percent"),
            "machine_us_per_packet": round(1e6 * busy / packets, 3),
            "fidelity": m["fidelity"]["verdict"], "engine": m.get("engine")}


def calibrate(progress=None, path: Path | None = None, repeats: int = REPEATS) -> dict:
    """Measure the budget with real runs (each of RUNS `repeats` times, interleaved, the
    median run kept); cache and return it."""
    path = path or CACHE
    progress = progress or (lambda msg: None)
    tmp = Path(tempfile.mkdtemp(prefix="aft-calibrate-"))
    tried: dict[str, list[dict]] = {name: [] for name in RUNS}
    try:
        for i in range(repeats):
            for name, (hops, topo, pairs) in RUNS.items():
                progress(f"calibration run {name!r} ({hops} switch hops), "
                         f"{i + 1} of {repeats}")
                tried[name].append(_measure(name, hops, topo, pairs, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    measured = {}
    for name, runs in tried.items():
        # the median run (a run's own figures, not a blend): one run's load varied
        # 28-46 % from run to run here, while its samples within a run agreed
        costs = [r["machine_us_per_packet"] for r in runs]
        keep = runs[costs.index(statistics.median_low(costs))]
        measured[name] = {**keep, "machine_us_per_packet_runs": costs}
    c1 = measured["one_hop"]["machine_us_per_packet"] / 1e6
    c3 = measured["three_hops"]["machine_us_per_packet"] / 1e6
    per_hop = max(0.0, (c3 - c1) / 2)
    c0 = max(c1 - per_hop, c1 / 2)        # what a packet costs before its first hop
    # by name: an unbuilt compiled path reports "interpreted (compiled path not built: ...)"
    engines = {engine_name(r["engine"]) for runs in tried.values() for r in runs}
    data = {"machine": machine_key(), "t": time.time(), "model": MODEL,
            # the agents' engine: a budget holds for the engine that measured it
            "engine": engines.pop() if len(engines) == 1 else ", ".join(sorted(engines)),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "runs": measured,
            "cost_us_per_packet": round(c0 * 1e6, 3),
            "cost_us_per_hop": round(per_hop * 1e6, 3),
            "budget_pps_direct": round(1 / c0),
            "utilization": UTILIZATION}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
    except OSError as exc:  # a read-only /var: keep going, say so
        progress(f"calibration not cached ({exc.strerror})")
    return data


def calibration(progress=None, force: bool = False) -> dict:
    """The cached calibration, or a new one (what `--rate auto` needs first)."""
    data = None if force else load_cached()
    return data if data is not None else calibrate(progress)


def script_rate(value: str | float, experiments, progress=print) -> float:
    """An experiment script's --rate: the number as given, or for "auto" one rate
    for all its runs (testbed.rate.common_rate), measuring this machine's calibration
    first when none is cached, as `testbed run --rate auto` does."""
    if value == "auto":
        calibration(progress=progress)
    return common_rate(value, experiments, progress)


def describe(cal: dict) -> str:
    r = cal["runs"]
    return "\n".join([
        f"# calibration of {cal['machine']['hostname']} ({cal['machine']['cpu_model']}, "
        f"{cal['machine']['cores']} cores) on {cal['date_utc']}",
        *(f"{name}: {v['packets']} packets over {v['switch_hops']} switch hops at "
          f"{CALIBRATION_MBPS:g} Mbit/s in {v['job_s']:.3f} s, CPU {v['cpu_mean_percent']}% "
          f"(the hypervisor's steal {v.get('steal_percent', 'n/a')}%): "
          f"{v['machine_us_per_packet']} us of the machine per packet ({v['fidelity']})"
          + (f"; the median of {len(v['machine_us_per_packet_runs'])} runs "
             f"({min(v['machine_us_per_packet_runs'])}-"
             f"{max(v['machine_us_per_packet_runs'])})"
             if len(v.get("machine_us_per_packet_runs") or ()) > 1 else "")
          for name, v in r.items()),
        f"cost per delivered packet: {cal['cost_us_per_packet']} us + "
        f"{cal['cost_us_per_hop']} us per switch hop; runs are planned to use "
        f"{UTILIZATION:.0%} of that budget",
        f"cached in {CACHE} for {MAX_AGE_S // 86400} days (testbed calibrate --force redoes it)",
    ])
