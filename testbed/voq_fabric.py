"""A permutation and an all-to-all on a 4 x 4 leaf-spine under four lossless fabrics:
ECMP or spraying, each with PFC or with virtual output queues (scripts/voq_fabric.py
compares them).

    ecmp+pfc   RoCE (go-back-N), static ECMP, PFC
    ecmp+voq   the same with voq = "on": a lossless queue per destination, paused one
               destination at a time
    spray+pfc  the UET-style transport (selective, tolerates reordering), per-packet
               spraying, PFC
    spray+voq  the same with voq = "on"
    scheduled  the credit-scheduled fabric (voq = "scheduled", fabric.scheduled): each
               sender's queue for a destination sends at the rate that destination's
               egress grants, sprayed, with the NIC's queues per destination and the ACKs
               in their own class; no pause anywhere

4 leaves, 4 spines, 4 hosts a leaf (16 endpoints: a port keeps at most 64 queues), the
uplinks at the hosts' rate, so a leaf's hosts fit its uplinks (non-blocking). `measure`
runs one fabric and workload and reads its figures: JCT / ideal, the spines' lossless
queue p99 over the PFC controller's samples while the workload ran, pause frames, the
switches that sent an XOFF (testbed.hol_incast.pause_reach), the destinations VOQ held,
lossless drops, retransmissions, the fidelity verdict, and for a permutation the
collision model's JCT (testbed.attribution.collision_model_s).
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from testbed.attribution import collision_model_s
from testbed.experiment import from_toml
from testbed.feature_plots import pfc_shift_s
from testbed.hol_incast import pause_reach
from testbed.run import run

WORKLOADS = ("permutation", "alltoall")
FABRICS = {
    "ecmp+pfc": {"transport": "roce", "entropy": "ecmp", "pfc": "on", "voq": "off"},
    "ecmp+voq": {"transport": "roce", "entropy": "ecmp", "pfc": "on", "voq": "on"},
    "spray+pfc": {"transport": "uet", "entropy": "spray", "pfc": "on", "voq": "off"},
    "spray+voq": {"transport": "uet", "entropy": "spray", "pfc": "on", "voq": "on"},
    "scheduled": {"transport": "uet", "entropy": "spray", "pfc": "on", "voq": "scheduled",
                  "nic_queues": "destination", "ack_class": "control"},
}
LEAVES = SPINES = HOSTS_PER_LEAF = 4


@dataclass
class FabricKnobs:
    """What a run of scripts/voq_fabric.py varies."""

    message_bytes: int = 1 << 20
    rate: str | float = ""            # the endpoints' Mbit/s ("": the topology's, or auto)
    window_packets: int = 16
    seed: int = 1
    leaves: int = LEAVES
    spines: int = SPINES
    hosts_per_leaf: int = HOSTS_PER_LEAF


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, nearest rank (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def spine_queue_p99_bytes(folder: Path, metrics: dict) -> float:
    """p99 of the PFC controller's samples of the spines' lossless egress backlog
    (pfc_timeline.csv, every spine port) while the workload ran (the whole run when the
    two clocks are not both recorded), bytes."""
    shift = pfc_shift_s(folder, metrics)
    end_s = metrics.get("jct_mean_s") or float("inf")
    with open(folder / "pfc_timeline.csv", newline="") as fh:
        samples = [float(r["backlog_bytes"]) for r in csv.DictReader(fh)
                   if r["node"].startswith("spine")
                   and (shift is None or 0 <= float(r["t_s"]) + shift <= end_s)]
    return percentile(samples, 99)


def measure(base: Path, fabric: str, workload: str, knobs: FabricKnobs) -> dict:
    """One run of `workload` on `fabric` in `base`; its figures."""
    if fabric not in FABRICS:
        raise ValueError(f"fabric {fabric!r}: one of {', '.join(FABRICS)}")
    exp = from_toml(None, {
        "name": f"{fabric.replace('+', '_')}_{workload}", "workload": workload,
        "message_bytes": knobs.message_bytes, "iterations": 1, "seed": knobs.seed,
        "rate": knobs.rate, "results_dir": str(base), "timeout_s": 600.0, "rto_ms": 200.0,
        "window_packets": knobs.window_packets, **FABRICS[fabric],
        "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
            "leaves": knobs.leaves, "spines": knobs.spines,
            "hosts_per_leaf": knobs.hosts_per_leaf}}})
    print(f"== {fabric}: {workload}", flush=True)
    folder, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    report = json.loads((folder / "pfc.json").read_text())
    model_s = None
    if workload == "permutation":
        with open(folder / "flows.csv", newline="") as fh:
            sends = [r for r in csv.DictReader(fh) if r["role"] == "send" and r.get("path")]
        if sends:
            model_s = collision_model_s(
                sends, from_toml(folder / "config.toml").resolve_topology())
    reach = pause_reach(report)
    return {"fabric": fabric, "workload": workload, "folder": folder.name,
            "jct_s": m["jct_mean_s"], "ideal_s": m["ideal_s"],
            "jct_over_ideal": m["jct_over_ideal"], "link_mbps": m["link_mbps"],
            "collision_model_s": model_s,
            "spine_queue_p99_bytes": spine_queue_p99_bytes(folder, m),
            "pause_frames": report["totals"]["frames_sent"],
            "xoff_frames": report["totals"]["xoff_frames"],
            "paused_s": report["totals"]["paused_s"],
            "switches_that_paused": reach["switches_that_paused"],
            "pause_hops": reach["pause_hops"], "voq": reach["voq"],
            "held_destinations": reach["held_destinations"],
            "held_queues": reach["held_queues"],
            "lossless_drops": report["totals"]["drops"],
            "retransmits": m["flows"]["retransmits"],
            "exactly_once": m["flows"]["exactly_once"],
            "headroom": report["headroom"]["verdict"],
            "controller_cpu_percent": report["controller"]["cpu_percent_of_core"],
            "credit_frames": (report.get("voq") or {}).get("grants", 0),
            "fidelity": m["fidelity"]["verdict"]}
