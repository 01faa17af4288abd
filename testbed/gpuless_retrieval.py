"""Retrieval RPCs of a cluster without GPUs on three fabrics of the same endpoint count
(scripts/gpuless_retrieval.py compares them).

    full_mesh       every node wired to every other, no switch (a one-tier mesh of CPU
                    nodes)
    leaf_spine      two leaves, two spines, the uplinks sized for the hosts (non-blocking)
    rail_optimized  servers of two endpoints, a rail leaf each, two spines (non-blocking)

The last half of the endpoints serve, the first half ask (workload rpc, traffic.rpc):
open-loop requests at Poisson instants, each client at a rate chosen as a fraction f of
what the servers' links can answer, f x (servers x B / response) / clients, the same on
every fabric (B the endpoints' link rate); and one closed-loop run per fabric (a fixed
number in flight per client), where Little's law holds. `measure` runs one fabric at one
load and reads its figures: RPC latency p50/p99/p99.9, RPCs per second, the time alone,
drops, the fidelity verdict, and the fabric's cost and power (metrics.json's fabric_cost,
topologies.physics.cost_table).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from testbed.experiment import from_toml
from testbed.run import run
from topologies import units
from traffic.rpc import plan_rpcs

FABRICS = ("full_mesh", "leaf_spine", "rail_optimized")
BASE_MBPS = 100.0            # every fabric's endpoint links before a --rate rescales them


@dataclass
class RetrievalKnobs:
    """What a run of scripts/gpuless_retrieval.py varies."""

    endpoints: int = 8
    request_bytes: int = 512
    response_bytes: int = 16384
    count: int = 100              # requests per client in each run
    rate_mbps: float = BASE_MBPS  # the endpoints' link rate
    seed: int = 1

    @property
    def servers(self) -> int:
        return self.endpoints // 2

    def servers_bound_per_s(self) -> float:
        """The responses per second the servers' links carry: servers x B / response."""
        return self.servers * units.mbps_to_bytes_per_s(self.rate_mbps) / self.response_bytes

    def client_rate_per_s(self, fraction: float) -> float:
        """Each client's open-loop request rate at `fraction` of the servers' bound."""
        return fraction * self.servers_bound_per_s() / (self.endpoints - self.servers)


def topology(fabric: str, endpoints: int) -> dict:
    """The [topology] table of `fabric` with `endpoints` endpoints (an even number)."""
    if fabric == "full_mesh":
        return {"kind": "full_mesh", "params": {"nodes": endpoints, "rate_mbps": BASE_MBPS}}
    if fabric == "leaf_spine":
        per_leaf = endpoints // 2
        return {"kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 2, "hosts_per_leaf": per_leaf, "rate_mbps": BASE_MBPS,
            "uplink_rate_mbps": per_leaf * BASE_MBPS / 2}}
    if fabric == "rail_optimized":
        return {"kind": "rail_optimized", "params": {
            "servers": endpoints // 2, "gpus_per_server": 2, "spines": 2,
            "rate_mbps": BASE_MBPS}}
    raise ValueError(f"fabric {fabric!r}: one of {', '.join(FABRICS)}")


def experiment(base: Path, fabric: str, fraction: float | None, closed: int,
               knobs: RetrievalKnobs) -> dict:
    """One run's settings: open loop at `fraction` of the servers' bound, or closed loop
    with `closed` requests in flight per client (fraction None)."""
    loop = ({"rpc_rate": knobs.client_rate_per_s(fraction)} if fraction is not None
            else {"rpc_rate": 0.0, "rpc_concurrency": closed})
    name = f"{fabric}_" + (f"load{fraction:g}".replace(".", "_") if fraction is not None
                           else f"closed{closed}")
    return {"name": name, "workload": "rpc", "iterations": 1, "seed": knobs.seed,
            "rate": knobs.rate_mbps, "results_dir": str(base), "timeout_s": 600.0,
            "rto_ms": 200.0, "rpc_request_bytes": knobs.request_bytes,
            "rpc_response_bytes": knobs.response_bytes, "rpc_count": knobs.count,
            "rpc_servers": knobs.servers, **loop,
            "topology": {"name": fabric, **topology(fabric, knobs.endpoints)}}


def cost_row(cost: dict) -> dict:
    """A fabric's switches, links, cost and power from metrics.json's fabric_cost."""
    return {"switches": sum(s["count"] for s in cost["switches"].values()),
            "links": sum(t["links"] for t in cost["links"].values()),
            "techs": sorted(cost["links"]), "cost_usd": cost["cost_usd"],
            "power_w": cost["power_w"]}


def measure(base: Path, fabric: str, fraction: float | None, closed: int,
            knobs: RetrievalKnobs) -> dict:
    """One run of `fabric` (open loop at `fraction`, or closed loop); its figures."""
    exp = from_toml(None, experiment(base, fabric, fraction, closed, knobs))
    what = f"load {fraction:g}" if fraction is not None else f"closed loop, {closed} in flight"
    print(f"== {fabric}: {what}", flush=True)
    folder, m = run(exp, progress=lambda s: print(f"   {s}", file=sys.stderr, flush=True))
    ol = m["open_loop"]
    clients = ol["clients"]
    planned = None
    if fraction is not None:      # the seeded plan's own arrivals: N over their span
        arrivals = [r.arrival_ns for r in plan_rpcs(exp.resolve_topology().endpoints(), exp,
                                                    None, exp.seed)]
        planned = len(arrivals) / ((max(arrivals) - min(arrivals)) / 1e9)
    return {"fabric": fabric, "fraction": fraction, "closed": closed if fraction is None
            else 0, "folder": folder.name, "link_mbps": m["link_mbps"],
            "rate_per_client_s": ol["rate_per_s"],
            "offered_per_s": ol["rate_per_s"] * clients if fraction is not None else None,
            "planned_per_s": planned,
            "clients": clients, "servers": ol["servers"], "rpcs_done": ol["rpcs_done"],
            "rpcs_asked": ol["rpcs_asked"], "p50_s": ol["latency_p50_s"],
            "p99_s": ol["latency_p99_s"], "p999_s": ol["latency_p999_s"],
            "mean_s": ol["latency_mean_s"], "alone_s": ol["alone_mean_s"],
            "rpcs_per_s": ol["rpcs_per_s"], "servers_bound_per_s": ol["servers_bound_per_s"],
            "drops": m["links"]["drops"], "retransmits": m["flows"]["retransmits"],
            "exactly_once": m["flows"]["exactly_once"],
            "fidelity": m["fidelity"]["verdict"] if m.get("fidelity") else "n/a",
            **cost_row(m["fabric_cost"])}
