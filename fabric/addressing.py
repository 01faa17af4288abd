"""Address plan (pure data): every fabric address comes from 198.18.0.0/15 (RFC 2544).

- Each link is a /31 out of 198.18.0.0/16, in the graph's edge order.
- Each node has a /32 on its loopback out of 198.19.0.0/16, endpoints first; traffic
  is addressed to it and sourced from it, whichever of the node's ports it uses.
- Each port's MAC follows from its link address (locally administered 02:00 + the four
  address bytes), so both ends of a link know each other's MAC before the link exists
  and every neighbour entry can be permanent (fabric/core.py): no ARP on the wire.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from topologies.spec import MAX_LINKS, MAX_NODES, Topology

FABRIC_NET = ipaddress.ip_network("198.18.0.0/15")
LINK_NET = ipaddress.ip_network("198.18.0.0/16")
LOOPBACK_NET = ipaddress.ip_network("198.19.0.0/16")


@dataclass(frozen=True)
class Port:
    """One end of a link: interface `ifname` of `node`, address/31 facing `peer`."""

    node: str
    ifname: str
    address: str
    peer: str
    peer_ifname: str
    peer_address: str

    @property
    def mac(self) -> str:
        return mac_for(self.address)

    @property
    def peer_mac(self) -> str:
        return mac_for(self.peer_address)


def mac_for(address: str) -> str:
    """The MAC of the port with link address `address`: 02:00 (locally administered,
    unicast) and the address's four bytes, unique because the addresses are."""
    ip = ipaddress.ip_address(address)
    if ip not in LINK_NET:
        raise ValueError(f"{address} is not a link address (from {LINK_NET})")
    return "02:00:" + ":".join(f"{b:02x}" for b in ip.packed)


@dataclass
class AddressPlan:
    ports: dict[str, list[Port]]   # node -> its ports in port order
    loopback: dict[str, str]       # node -> its /32

    def port(self, node: str, peer: str) -> Port:
        return next(p for p in self.ports[node] if p.peer == peer)

    def owner(self, address: str) -> str | None:
        """The node an address belongs to (for reading traceroute replies)."""
        for node, lo in self.loopback.items():
            if lo == address:
                return node
        for node, ports in self.ports.items():
            if any(p.address == address for p in ports):
                return node
        return None


def plan(topo: Topology) -> AddressPlan:
    g = topo.graph
    # Topology.validate refuses larger specs (topologies/spec.py sizes them from these nets)
    assert LINK_NET.num_addresses // 2 == MAX_LINKS
    assert LOOPBACK_NET.num_addresses - 2 == MAX_NODES
    if g.number_of_edges() > MAX_LINKS:
        raise ValueError(f"too many links for {LINK_NET}")
    if g.number_of_nodes() > MAX_NODES:
        raise ValueError(f"too many nodes for {LOOPBACK_NET}")
    base = int(LINK_NET.network_address)
    ends: dict[tuple[str, str], str] = {}
    for i, (a, b) in enumerate(g.edges()):
        ends[(a, b)] = str(ipaddress.ip_address(base + 2 * i))
        ends[(b, a)] = str(ipaddress.ip_address(base + 2 * i + 1))
    ports = {}
    for node in g.nodes:
        ports[node] = [Port(node, topo.ifname(node, peer), ends[(node, peer)], peer,
                            topo.ifname(peer, node), ends[(peer, node)])
                       for peer in topo.ports(node)]
    lo_base = int(LOOPBACK_NET.network_address)
    loopback = {node: str(ipaddress.ip_address(lo_base + 1 + i))
                for i, node in enumerate(topo.endpoints() + topo.switches())}
    return AddressPlan(ports, loopback)
