"""Mice, elephants and both on a leaf-spine under several load-balancing modes and
congestion controls (scripts/mice_vs_elephants.py compares them).

    mixes      mice       open-loop flows (workload flows) at a load, small sizes
               elephants  a permutation of message_bytes each (workload permutation)
               both       the mice beside the elephants (flows, flow_background elephants)
    modes      ecmp       the kernel's hash per flow (entropy ecmp)
               dlb        switch DLB: least loaded egress per flowlet (switch_lb dlb)
               spray      a new path per packet (entropy spray)
    controls   pfc        ECMP with PFC on
               dcqcn      ECMP, ECN marks and DCQCN (RoCE's congestion control)
               nscc       ECMP, ECN marks and NSCC (the UET transport's)

The three modes and PFC run the UET-style transport (selective retransmission, reordering
tolerated), so they differ only in where a packet goes; DCQCN is RoCE's and runs it.
`measure` runs one mix under one mode or control and reads its figures: the mice's
slowdown p50 / p99 in the smallest size bucket and over every flow (and over the flows
that arrived while the elephants still ran), the elephants' JCT over the ideal S / B and
over the max-min model of their paths (testbed.attribution.collision_model_s: the hashed
paths under ECMP, an even split under spraying), drops and the fidelity verdict.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from testbed.attribution import collision_model_s
from testbed.experiment import from_toml
from testbed.run import run
from topologies import units
from topologies.stats import percentile
from traffic.open_loop import BACKGROUND_TAG, TAG

MIXES = ("mice", "elephants", "both")
UET = {"transport": "uet", "entropy": "ecmp"}
MODES = {"ecmp": UET, "dlb": {**UET, "switch_lb": "dlb"},
         "spray": {**UET, "entropy": "spray"}}
CONTROLS = {"pfc": {**UET, "pfc": "on"},
            "dcqcn": {"transport": "roce", "entropy": "ecmp", "ecn": "on", "cc": "dcqcn"},
            "nscc": {**UET, "ecn": "on", "cc": "nscc"}}
SETTINGS = {**MODES, **CONTROLS}
SIZES = "fb_hadoop"


@dataclass
class MixKnobs:
    """What a run of scripts/mice_vs_elephants.py varies."""

    sizes: str = SIZES            # the mice's flow-size distribution
    load: float = 0.2             # each host's offered load of mice
    flows: int = 150              # mice per run, over every host
    message_bytes: int = 2 << 20  # each elephant
    rate: str | float = ""        # the endpoints' Mbit/s ("": the topology's, or auto)
    seed: int = 1
    leaves: int = 2
    spines: int = 2
    hosts_per_leaf: int = 4


def experiment(base: Path, mix: str, mode: str, knobs: MixKnobs) -> dict:
    """The settings of one run (from_toml's flat table)."""
    if mix not in MIXES or mode not in SETTINGS:
        raise ValueError(f"mix {mix!r} / mode {mode!r}: one of {MIXES} / {tuple(SETTINGS)}")
    data = {"name": f"{mix}_{mode}", "iterations": 1, "seed": knobs.seed, "rate": knobs.rate,
            "results_dir": str(base), "timeout_s": 600.0, "rto_ms": 200.0,
            "message_bytes": knobs.message_bytes, **SETTINGS[mode],
            "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
                "leaves": knobs.leaves, "spines": knobs.spines,
                "hosts_per_leaf": knobs.hosts_per_leaf}}}
    if mix == "elephants":
        return {**data, "workload": "permutation"}
    return {**data, "workload": "flows", "flow_sizes": knobs.sizes, "flow_load": knobs.load,
            "flow_count": knobs.flows,
            "flow_background": "elephants" if mix == "both" else "none"}


def _sends(folder: Path) -> list[dict]:
    with open(folder / "flows.csv", newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["role"] == "send"]


def _model_s(folder: Path, sends: list[dict]) -> float | None:
    """The elephants' JCT by max-min on their recorded paths (None without paths)."""
    rows = [r for r in sends if r.get("path")]
    if not rows:
        return None
    return collision_model_s(rows, from_toml(folder / "config.toml").resolve_topology())


def mice_figures(folder: Path, ol: dict, elephants_s: float | None) -> dict:
    """The mice's slowdowns from metrics.json's open_loop and flows.csv: the smallest size
    bucket, every flow, and the flows that arrived before the elephants finished."""
    small = ol["buckets"][0] if ol["buckets"] else {}
    during = []
    if elephants_s:
        during = [float(r["slowdown"]) for r in _sends(folder)
                  if r["tag"].startswith(TAG + ".") and r.get("slowdown")
                  and r.get("arrival_s") and float(r["arrival_s"]) < elephants_s]
    return {"mice_done": ol["flows_done"], "mice_asked": ol["flows_asked"],
            "small_high_bytes": small.get("high_bytes"), "small_flows": small.get("flows"),
            "small_p50": small.get("p50"), "small_p99": small.get("p99"),
            "all_p50": ol["slowdown_p50"], "all_p99": ol["slowdown_p99"],
            "mean": ol["slowdown_mean"], "ps_slowdown": ol["ps_slowdown"],
            "during_flows": len(during), "during_p99": percentile(during, 99)}


def measure(base: Path, mix: str, mode: str, knobs: MixKnobs) -> dict:
    """One run of `mix` under `mode` in `base`; its figures."""
    exp = from_toml(None, experiment(base, mix, mode, knobs))
    print(f"== {mix}: {mode}", flush=True)
    folder, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    row = {"mix": mix, "mode": mode, "folder": folder.name, "link_mbps": m["link_mbps"],
           "ideal_s": units.transfer_s(knobs.message_bytes, m["link_mbps"]),
           "drops": m["links"]["drops"], "retransmits": m["flows"]["retransmits"],
           "exactly_once": m["flows"]["exactly_once"],
           "fidelity": m["fidelity"]["verdict"] if m.get("fidelity") else "n/a",
           "elephants_s": None, "model_s": None, "mice": None}
    sends = _sends(folder)
    if mix == "elephants":
        row["elephants_s"] = m["jct_mean_s"]
        row["model_s"] = _model_s(folder, sends)
    else:
        ol = m["open_loop"]
        if mix == "both":
            row["elephants_s"] = ol["background"]["jct_s"]
            row["model_s"] = _model_s(folder, [r for r in sends
                                               if r["tag"].startswith(BACKGROUND_TAG + ".")])
        row["mice"] = mice_figures(folder, ol, row["elephants_s"])
    row["elephants_over_ideal"] = (row["elephants_s"] / row["ideal_s"]
                                   if row["elephants_s"] else None)
    return row
