"""Claim 2's fabric: an incast beside a victim flow, run with PFC off, on, or with virtual
output queues, and where each run's backpressure reached.

Leaf-spine, 2 leaves x 4 hosts, one spine, uplinks at 4x the host rate (a leaf's four
hosts at line rate fit its uplink), so the only bottleneck is leaf1's port to l1h0.
Incast: l0h0, l0h1, l0h2 -> l1h0. Victim: l0h3 -> l1h1, an uncongested receiver whose
path shares leaf0, its uplink and the spine with the incast. RoCE go-back-N on the
lossless class. scripts/pfc_hol.py compares the three modes; scripts/bench_voq.py
repeats PFC and VOQ in rounds.

`pause_reach` reads a run's pfc.json: the switches that sent an XOFF (a PFC pause of
the whole class, or a VOQ pause of one destination's queue: both count in the ports'
`xoff_frames`), their number (`pause_hops`: how many switches the backpressure reached,
counting the congested one), and under VOQ the destinations whose queues were held and
how many held queues fed a destination other than the incast's receiver.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from testbed.experiment import from_toml
from testbed.rate import frame_bits
from testbed.run import run

INCAST = ["l0h0>l1h0", "l0h1>l1h0", "l0h2>l1h0"]
VICTIM = "l0h3>l1h1"
SHARED_VICTIM = "l0h0>l1h1"             # a victim from a host that also sends into the incast
RECEIVER = "l1h0"                       # the incast's receiver: the congested egress
HOST_MBPS = 100.0
UPLINK_MBPS = 4 * HOST_MBPS             # a leaf's 4 hosts at line rate: non-blocking
# PFC off, PFC on, PFC on with a queue per destination in the fabric, the same with the
# NIC's queues per destination and the ACKs in their own class, and the credit-scheduled
# fabric (fabric.scheduled: no pause at all)
MODES = ("off", "on", "voq", "voq_nic", "scheduled")
CLAIM2_MODES = ("off", "on", "voq", "scheduled")      # claim 2's runs (scripts/pfc_hol.py)
NIC_KEYS = {"nic_queues": "destination", "ack_class": "control"}
MODE_KEYS = {"off": {"pfc": "off"}, "on": {"pfc": "on"}, "voq": {"pfc": "on", "voq": "on"},
             "voq_nic": {"pfc": "on", "voq": "on", **NIC_KEYS},
             "scheduled": {"pfc": "on", "voq": "scheduled", "entropy": "spray", **NIC_KEYS}}


@dataclass
class HolKnobs:
    """What a claim-2 run varies: the flows' size and the switches' buffers."""

    message_bytes: int = 3_000_000
    queue_bytes: int = 2 << 20
    xoff_bytes: int = 150_000
    window_packets: int = 512
    seed: int = 1


def line_goodput_mbps(payload_bytes: int) -> float:
    """A host's goodput at its line rate: B x payload / frame (Mbit/s)."""
    return HOST_MBPS * payload_bytes * 8 / frame_bits(payload_bytes)


def victim_fluid_mbps(payload_bytes: int, victim: str = VICTIM) -> float:
    """The victim's goodput in the fluid model with queues per destination: its line rate,
    or, when its host also sends into the incast (whose flow drains at B / n), the rest of
    its link, B (1 - 1 / n)."""
    shared = any(p.split(">")[0] == victim.split(">")[0] for p in INCAST)
    return line_goodput_mbps(payload_bytes) * ((1 - 1 / len(INCAST)) if shared else 1.0)


def incast_jct_s(message_bytes: int) -> float:
    """The incast's JCT when the congested port drains at its line rate: n S / B."""
    return len(INCAST) * message_bytes * 8 / (HOST_MBPS * 1e6)


def pause_reach(report: dict, receiver: str = RECEIVER) -> dict:
    """Where a run's backpressure reached, from its pfc.json (`report`)."""
    paused_by = sorted({port.split(":")[0] for port, c in report["ports"].items()
                        if c["xoff_frames"]})
    voq = report.get("voq") or {}
    held = [r for r in voq.get("pairs", []) if r["holds"]]
    return {"switches_that_paused": paused_by, "pause_hops": len(paused_by),
            "voq": bool(voq.get("enabled")),
            "held_destinations": voq.get("held_destinations", []),
            "held_links": voq.get("held_links", []),
            "held_queues": voq.get("held_queues", 0),
            "held_elsewhere": sum(1 for r in held if r["dest"] != receiver)}


def read_run(folder: Path, victim_pair: str = VICTIM) -> tuple[dict, list[dict], dict]:
    """A claim-2 run's victim (its receiver's flows.csv row), the incast's senders' rows
    and its pfc.json."""
    with open(folder / "flows.csv") as fh:
        flows = list(csv.DictReader(fh))
    victim = next(f for f in flows if f["role"] == "recv" and f["tag"].endswith(victim_pair))
    incast = [f for f in flows if f["role"] == "send" and f["tag"].split(".", 1)[1] in INCAST]
    return victim, incast, json.loads((folder / "pfc.json").read_text())


def measure(base: Path, mode: str, knobs: HolKnobs, name: str = "pfc",
            victim_pair: str = VICTIM) -> dict:
    """One run in `base`: PFC "off", "on", "voq" or "voq_nic", the incast beside
    `victim_pair`; its figures."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    exp = from_toml(None, {
        "name": f"{name}_{mode}", "workload": "p2p", "pairs": INCAST + [victim_pair],
        "message_bytes": knobs.message_bytes, "iterations": 1, "transport": "roce",
        "entropy": "ecmp", "seed": knobs.seed, **MODE_KEYS[mode],
        "window_packets": knobs.window_packets,
        "pfc_xoff_bytes": knobs.xoff_bytes, "pfc_xon_bytes": knobs.xoff_bytes // 2,
        "results_dir": str(base), "timeout_s": 300.0, "rto_ms": 200.0,
        "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 1, "hosts_per_leaf": 4,
            "uplink_rate_mbps": UPLINK_MBPS,
            "queue_bytes": knobs.queue_bytes}}})
    print(f"== {name} {mode}", flush=True)
    folder, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    victim, incast, report = read_run(folder, victim_pair)
    return {"mode": mode, "folder": folder.name,
            "victim_mbps": float(victim["goodput_mbps"]) if victim["goodput_mbps"] else 0.0,
            "victim_fct_s": float(victim["fct_s"]) if victim["fct_s"] else None,
            "incast_jct_s": max(float(f["fct_s"]) for f in incast),
            "lossless_drops": report["totals"]["drops"],
            "pause_frames": report["totals"]["frames_sent"],
            "paused_s": report["totals"]["paused_s"],
            **pause_reach(report),
            "retransmits": m["flows"]["retransmits"], "exactly_once": m["flows"]["exactly_once"],
            "headroom": report["headroom"]["verdict"],
            "reaction_ms_p50": report["reaction_ms"].get("p50"),
            "controller_cpu_percent": report["controller"]["cpu_percent_of_core"],
            "fidelity": m["fidelity"]["verdict"], "fidelity_reasons": m["fidelity"]["reasons"],
            "payload_bytes": exp.payload_bytes}
