"""Which way the kernel sends a flow: one route lookup per hop with the flow's 5-tuple.

A fabric's switches choose among equal-cost next hops by the frame's L4 hash
(fib_multipath_hash_policy = 1, seeded by fib_multipath_hash_seed), so a flow's path
follows from its source port. Each hop is asked as `ip route get <dst> from <src> iif
<port> ipproto udp sport <S> dport 4791` asks it: an RTM_GETROUTE with RTA_IIF,
RTA_IP_PROTO, RTA_SPORT and RTA_DPORT, which the kernel answers through the same input
route lookup, and the same multipath hash, as a forwarded frame. pyroute2's route
message does not know the last three attributes (its map ends at RTA_EXPIRES), so the
request is built here, a netlink header, an rtmsg and six attributes.

    flow_path(fab, topo, src, dst, first_hop, sport) -> [src, leaf, spine, ..., dst]
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct

from fabric import netns
from fabric.addressing import plan as address_plan
from topologies.spec import Topology

ROCE_UDP_PORT = 4791
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
RTA_DST, RTA_SRC, RTA_IIF, RTA_OIF = 1, 2, 3, 4
RTA_IP_PROTO, RTA_SPORT, RTA_DPORT = 27, 28, 29
_HDR = struct.Struct("=IHHII")           # nlmsghdr: len, type, flags, seq, pid
_RTMSG = struct.Struct("=BBBBBBBBI")     # family, dst_len, src_len, tos, table, proto,
_RTA = struct.Struct("=HH")              # scope, type, flags; an attribute's len, type


def _attr(kind: int, value: bytes) -> bytes:
    body = _RTA.pack(_RTA.size + len(value), kind) + value
    return body + b"\0" * (-len(body) % 4)


def route_request(src: str, dst: str, iif: int, sport: int, seq: int = 1) -> bytes:
    """An RTM_GETROUTE for a UDP frame src:sport -> dst:4791 that came in on `iif`."""
    body = (_RTMSG.pack(socket.AF_INET, 32, 32, 0, 0, 0, 0, 0, 0)
            + _attr(RTA_DST, ipaddress.ip_address(dst).packed)
            + _attr(RTA_SRC, ipaddress.ip_address(src).packed)
            + _attr(RTA_IIF, struct.pack("=I", iif))
            + _attr(RTA_IP_PROTO, bytes([socket.IPPROTO_UDP]))
            + _attr(RTA_SPORT, struct.pack("!H", sport))
            + _attr(RTA_DPORT, struct.pack("!H", ROCE_UDP_PORT)))
    return _HDR.pack(_HDR.size + len(body), RTM_GETROUTE, NLM_F_REQUEST, seq, 0) + body


def output_ifindex(reply: bytes) -> int:
    """RTA_OIF of the kernel's answer; OSError with its errno for a refusal."""
    length, kind, _, _, _ = _HDR.unpack_from(reply)
    if kind == NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", reply, _HDR.size)
        raise OSError(-code, os.strerror(-code))
    if kind != RTM_NEWROUTE:
        raise OSError(errno.EPROTO, f"netlink answered type {kind}, not a route")
    at = _HDR.size + _RTMSG.size
    while at + _RTA.size <= length:
        size, attr = _RTA.unpack_from(reply, at)
        if attr == RTA_OIF:
            return struct.unpack_from("=I", reply, at + _RTA.size)[0]
        at += (size + 3) & ~3
    raise OSError(errno.ENOENT, "the route has no output interface")


class PathFinder:
    """Asks each forwarding node of a running fabric where a flow goes next; one
    netlink socket per node, answers cached by (node, in port, src, dst, sport)."""

    def __init__(self, fab, topo: Topology):
        self.fab, self.topo = fab, topo
        plan = address_plan(topo)
        self.loopback = plan.loopback
        self._socks: dict[str, tuple[socket.socket, dict[str, int], dict[int, str]]] = {}
        self._cache: dict[tuple, str] = {}

    def _node(self, node: str):
        if node not in self._socks:
            with netns.entered(self.fab.ns(node)):
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW,
                                     socket.NETLINK_ROUTE)
                index = {name: i for i, name in socket.if_nameindex()}
            sock.settimeout(2.0)
            self._socks[node] = (sock, index, {i: n for n, i in index.items()})
        return self._socks[node]

    def next_hop(self, node: str, came_from: str, src: str, dst: str, sport: int) -> str:
        key = (node, came_from, src, dst, sport)
        if key not in self._cache:
            sock, index, name = self._node(node)
            iif = index[self.topo.ifname(node, came_from)]
            sock.send(route_request(self.loopback[src], self.loopback[dst], iif, sport))
            oif = output_ifindex(sock.recv(65536))
            self._cache[key] = self.topo.peer(node, name[oif])
        return self._cache[key]

    def path(self, src: str, dst: str, first_hop: str, sport: int) -> list[str]:
        """src, the node its frames go to (`first_hop`: the sender picks its port), then
        each node's choice, to dst."""
        hops = [src, first_hop]
        while hops[-1] != dst:
            if len(hops) > self.topo.graph.number_of_nodes():
                raise OSError(errno.ELOOP, f"{src} -> {dst} sport {sport} loops: {hops}")
            hops.append(self.next_hop(hops[-1], hops[-2], src, dst, sport))
        return hops

    def close(self) -> None:
        for sock, _, _ in self._socks.values():
            sock.close()
        self._socks.clear()
