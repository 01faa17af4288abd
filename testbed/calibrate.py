"""Calibration: this machine's packet budget, measured with the real agents and real
kernel forwarding, cached per machine with its date (the model that uses it: testbed.rate).

    direct:  full_mesh(2)               agent -> veth -> agent            0 switch hops
    hops:    leaf_spine(2 x 1 x 1 host)  agent -> leaf -> spine -> leaf -> agent  3 hops
    each: two elephants, one each way, on 10 Gbit/s links, so the machine and not the
    links sets the pace; delivered data packets / job time = packets per second
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from testbed.experiment import Experiment
from testbed.rate import CACHE, MAX_AGE_S, UTILIZATION, load_cached, machine_key
from testbed.run import RunFailedError, run

CALIBRATION_MBPS = 10_000.0
CALIBRATION_BYTES = 128 << 20         # per flow: 32k packets of 4 KiB, ~1 s here
RUNS = {  # name -> (switch hops, experiment settings)
    "direct": (0, {"kind": "full_mesh", "params": {"nodes": 2}}, ["cpu0>cpu1", "cpu1>cpu0"]),
    "hops": (3, {"kind": "leaf_spine", "params": {"leaves": 2, "spines": 1,
                                                  "hosts_per_leaf": 1}},
             ["l0h0>l1h0", "l1h0>l0h0"]),
}




class CalibrationError(RuntimeError):
    """The calibration runs did not give a budget (they failed, or were unfaithful)."""


def calibrate(progress=None, path: Path | None = None) -> dict:
    """Measure the budget with two real runs; cache and return it."""
    path = path or CACHE
    progress = progress or (lambda msg: None)
    tmp = Path(tempfile.mkdtemp(prefix="aft-calibrate-"))
    measured = {}
    try:
        for name, (hops, topo, pairs) in RUNS.items():
            topo = {**topo, "params": {**topo["params"], "rate_mbps": CALIBRATION_MBPS}}
            exp = Experiment(name=f"calibrate_{name}", workload="p2p", pairs=pairs,
                             message_bytes=CALIBRATION_BYTES, iterations=1, topology=topo,
                             results_dir=str(tmp), timeout_s=60.0).validate()
            progress(f"calibration run {name!r} ({hops} switch hops)")
            try:
                _, m = run(exp)
            except RunFailedError as exc:
                raise CalibrationError(f"calibration run {name!r} failed: {exc}") from None
            packets = m["flows"]["bytes_delivered"] / exp.payload_bytes
            measured[name] = {"switch_hops": hops, "packets": round(packets),
                              "job_s": m["jct_mean_s"], "pps": packets / m["jct_mean_s"],
                              "cpu_mean_percent": m["cpu"]["cpu_mean_percent"],
                              "fidelity": m["fidelity"]["verdict"]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    c0 = 1 / measured["direct"]["pps"]
    c3 = 1 / measured["hops"]["pps"]
    per_hop = max(0.0, (c3 - c0) / RUNS["hops"][0])
    data = {"machine": machine_key(), "t": time.time(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "runs": measured,
            "cost_us_per_packet": round(c0 * 1e6, 3),
            "cost_us_per_hop": round(per_hop * 1e6, 3),
            "budget_pps_direct": round(measured["direct"]["pps"]),
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


def describe(cal: dict) -> str:
    r = cal["runs"]
    return "\n".join([
        f"# calibration of {cal['machine']['hostname']} ({cal['machine']['cpu_model']}, "
        f"{cal['machine']['cores']} cores) on {cal['date_utc']}",
        *(f"{name}: {v['packets']} packets over {v['switch_hops']} switch hops in "
          f"{v['job_s']:.3f} s = {v['pps']:.0f} packets/s (CPU {v['cpu_mean_percent']}%, "
          f"{v['fidelity']})" for name, v in r.items()),
        f"cost per delivered packet: {cal['cost_us_per_packet']} us + "
        f"{cal['cost_us_per_hop']} us per switch hop; runs are planned to use "
        f"{UTILIZATION:.0%} of that budget",
        f"cached in {CACHE} for {MAX_AGE_S // 86400} days (testbed calibrate --force redoes it)",
    ])
