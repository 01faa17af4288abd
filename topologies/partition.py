"""Placing one fabric on several machines (pure data): which server holds which node.

    topology graph ─ NVLink domains (a server's GPUs and NVSwitch) contracted to one
    vertex each ─▶ METIS k-way partition (pymetis): vertices weighed by the forwarding
    work they carry, edges by link rate ─▶ Partition: nodes per server, the cut links

A vertex's work is the sum of its links' rates: what a node's ports may carry at line
rate, which is what its namespace's kernel forwards (a switch) or its agent sends and
receives (an endpoint). Edges weigh their rate, so the cut the partitioner minimises is
the traffic the machines' underlay may have to carry. An NVLink domain stays on one
machine: split, every one of its NVLink edges (9x a rail's rate, here) would cross the
underlay. A cut link becomes a VXLAN link (fabric.vxlan) between its two servers.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

import networkx as nx

from topologies.settings import setting
from topologies.spec import SpecError, Topology

MAX_SERVERS = 64
# A server as ssh takes it: [user@]host, the host a name of dot-separated labels (RFC 1123:
# letters, digits and inner '-', 63 characters a label, 253 in all; '_' too, as ssh_config
# aliases have it) or an IPv4 or IPv6 address. Nothing a shell or ssh reads otherwise:
# no '$', backticks, quotes, parentheses, spaces, '%' or a leading '-'.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOST_NAME_RE = re.compile(rf"\A(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*\Z")
USER_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")


@dataclass(frozen=True)
class CutLink:
    a: str
    b: str
    server_a: str
    server_b: str
    rate_mbps: float


@dataclass(frozen=True)
class Partition:
    servers: tuple[str, ...]
    placement: dict[str, str]          # node -> server
    cut: tuple[CutLink, ...]
    work_mbps: dict[str, float]        # server -> the forwarding work it carries

    def nodes_on(self, server: str) -> list[str]:
        return [n for n, s in self.placement.items() if s == server]

    def cut_gbps(self) -> float:
        """What the cut links carry at line rate, one way (the underlay carries as much
        the other way)."""
        return sum(c.rate_mbps for c in self.cut) / 1000

    def imbalance(self) -> float:
        """The busiest server's work over the mean (1.0: even)."""
        mean = sum(self.work_mbps.values()) / len(self.work_mbps)
        return max(self.work_mbps.values()) / mean if mean else 1.0

    def lines(self, topo: Topology) -> list[str]:
        """The plan as a user reads it before anything is built."""
        roles = nx.get_node_attributes(topo.graph, "role")
        out = [f"placement of {topo.name} ({len(self.placement)} nodes) on "
               f"{len(self.servers)} servers (METIS, NVLink domains kept whole):"]
        for s in self.servers:
            nodes = self.nodes_on(s)
            count: dict[str, int] = {}
            for n in nodes:
                count[roles.get(n, "node")] = count.get(roles.get(n, "node"), 0) + 1
            out.append(f"  {s}: {len(nodes)} nodes ("
                       + ", ".join(f"{k} {v}" for k, v in sorted(count.items()))
                       + f"), forwarding work {self.work_mbps[s] / 1000:g} Gbit/s")
        out.append(f"  cut: {len(self.cut)} links over VXLAN, {self.cut_gbps():g} Gbit/s "
                   "each way at line rate (the most the underlay carries); work "
                   f"imbalance {self.imbalance():.2f}x the mean")
        return out

    def to_json(self) -> dict:
        return {"servers": {s: self.nodes_on(s) for s in self.servers},
                "cut": [c.__dict__ for c in self.cut], "cut_gbps": self.cut_gbps(),
                "work_mbps": self.work_mbps, "imbalance": round(self.imbalance(), 3)}


def servers_list(text: str) -> list[str]:
    """The --servers flag's value: host names, comma-separated."""
    return [s.strip() for s in text.split(",")]


@dataclass
class ClusterSettings:
    """Several machines: one fabric spread over servers reached by ssh (docs/cluster.md)"""

    servers: list[str] = setting(
        factory=list, help="the machines the fabric is spread over, as ssh reaches them "
        "(none: this machine alone); in a file, the [cluster] table's key",
        metavar="HOST,HOST", convert=servers_list)

    def check_cluster(self) -> None:
        if not isinstance(self.servers, list) or not all(isinstance(s, str)
                                                         for s in self.servers):
            raise SpecError("cluster.servers", "must be a list of host names")
        if self.servers:
            check_servers(self.servers, "cluster.servers")


def check_servers(servers: list[str], where: str = "servers") -> list[str]:
    if not 1 <= len(servers) <= MAX_SERVERS:
        raise SpecError(where, f"{len(servers)} servers; allowed 1-{MAX_SERVERS}")
    for s in servers:
        if not is_host(s):
            raise SpecError(where, f"{s!r} is not a host name or address ([user@]host; "
                            "a name of letters, digits, '-', '_' and dots, not starting "
                            "with '-'; an IPv4 or IPv6 address)")
    if len(set(servers)) != len(servers):
        raise SpecError(where, "a server is listed twice: " + ", ".join(servers))
    return servers


def is_host(text: str) -> bool:
    """Whether `text` is a server as ssh takes it (HOST_NAME_RE's comment)."""
    user, at, host = text.rpartition("@")
    if at and not USER_RE.match(user):
        return False
    if HOST_NAME_RE.match(host) and not host.startswith("-"):
        return True
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return "%" not in host


def domains(topo: Topology) -> list[list[str]]:
    """The indivisible groups: each server's NVLink domain (its nodes with one `server`
    attribute), every other node alone."""
    groups: dict[object, list[str]] = {}
    for node, server in topo.graph.nodes(data="server"):
        groups.setdefault(("server", server) if server is not None else node, []).append(node)
    return list(groups.values())


def work_mbps(topo: Topology, node: str) -> float:
    return sum(d["rate_mbps"] for _, _, d in topo.graph.edges(node, data=True))


def partition(topo: Topology, servers: list[str], seed: int = 1) -> Partition:
    """Place `topo` on `servers` (module docstring)."""
    import pymetis

    check_servers(servers)
    groups = domains(topo)
    if len(groups) < len(servers):
        raise SpecError("servers", f"{len(servers)} servers for {len(groups)} indivisible "
                        "parts of the fabric (NVLink domains and single nodes)")
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    if len(servers) == 1:
        parts = [0] * len(groups)
    else:
        weight: dict[tuple[int, int], float] = {}
        for a, b, d in topo.graph.edges(data=True):
            ga, gb = group_of[a], group_of[b]
            if ga != gb:
                key = (min(ga, gb), max(ga, gb))
                weight[key] = weight.get(key, 0.0) + d["rate_mbps"]
        xadj, adjncy, eweights = [0], [], []
        for g in range(len(groups)):
            for (x, y), w in sorted(weight.items()):
                if g in (x, y):
                    adjncy.append(y if g == x else x)
                    eweights.append(max(1, round(w)))
            xadj.append(len(adjncy))
        vweights = [max(1, round(sum(work_mbps(topo, n) for n in g))) for g in groups]
        opts = pymetis.Options(seed=seed)
        _, parts = pymetis.part_graph(len(servers), pymetis.CSRAdjacency(xadj, adjncy),
                                      vweights=vweights, eweights=eweights, options=opts)
    placement = {n: servers[parts[group_of[n]]] for n in topo.graph.nodes}
    cut = tuple(CutLink(a, b, placement[a], placement[b], d["rate_mbps"])
                for a, b, d in topo.graph.edges(data=True) if placement[a] != placement[b])
    work = {s: 0.0 for s in servers}
    for n, s in placement.items():
        work[s] += work_mbps(topo, n)
    return Partition(tuple(servers), placement, cut, work)
