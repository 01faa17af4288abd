"""Probes on real packets: ICMP reachability between endpoints and TTL-limited path traces.

Sockets are opened inside the source node's namespace (fabric.netns.entered), so every
probe leaves through that node's ports and crosses the fabric's kernel forwarding.
A trace keeps the UDP 5-tuple constant across TTLs, so under ECMP every probe of one
trace hashes onto the same path, and the path seen is the one that 5-tuple takes.
"""

from __future__ import annotations

import math
import os
import select
import socket
import struct
import time

from fabric import netns
from fabric.addressing import AddressPlan
from fabric.fds import readable

ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY = 8, 0
ICMP_TIME_EXCEEDED, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH = 11, 3, 3
TRACE_DPORT = 33434


def _echo_request(ident: int, seq: int) -> bytes:
    from scapy.utils import checksum  # on use: the fabric modules load no scapy
    payload = b"aft-probe" + struct.pack("!d", time.time())
    header = struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, 0, ident, seq)
    csum = checksum(header + payload)
    return struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, csum, ident, seq) + payload


def ping_all(fabric, endpoints: list[str], timeout_s: float = 2.0,
             attempts: int = 3) -> dict[tuple[str, str], bool]:
    """Echo from every endpoint to every other; (src, dst) -> a reply came back.

    Unanswered pairs are asked again up to `attempts` times (the first packet of a
    pair may wait for ARP on every hop).
    """
    plan = fabric.plan
    result = {(s, d): False for s in endpoints for d in endpoints if s != d}
    socks = {}
    for src in endpoints:
        with netns.entered(fabric.ns(src)):
            socks[src] = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xFFFF
    try:
        for _ in range(attempts):
            pending = [pair for pair, ok in result.items() if not ok]
            if not pending:
                break
            seq_of = {}
            for seq, (src, dst) in enumerate(pending):
                seq_of[(src, seq & 0xFFFF)] = dst
                socks[src].sendto(_echo_request(ident, seq & 0xFFFF),
                                  (plan.loopback[dst], 0))
            deadline = time.monotonic() + timeout_s
            by_fd = {s.fileno(): src for src, s in socks.items()}
            poller = select.poll()          # not select(2): a big fabric passes fd 1024
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            while time.monotonic() < deadline and not all(result[p] for p in pending):
                left_ms = math.ceil(max(0.0, deadline - time.monotonic()) * 1000)
                for fd, _ in poller.poll(left_ms):
                    src = by_fd[fd]
                    sock = socks[src]
                    packet, (addr, _) = sock.recvfrom(65535)
                    ihl = (packet[0] & 0x0F) * 4
                    kind, _, _, rid, rseq = struct.unpack("!BBHHH", packet[ihl:ihl + 8])
                    dst = seq_of.get((src, rseq))
                    if kind == ICMP_ECHO_REPLY and rid == ident and dst \
                            and plan.loopback[dst] == addr:
                        result[(src, dst)] = True
    finally:
        for sock in socks.values():
            sock.close()
    return result


def trace(fabric, src: str, dst: str, sport: int = 40000, max_ttl: int = 12,
          timeout_s: float = 1.0) -> list[str | None]:
    """Nodes on the path from src to dst for UDP sport -> TRACE_DPORT: [src, ..., dst].

    A hop that does not answer within `timeout_s` is None.
    """
    plan = fabric.plan
    with netns.entered(fabric.ns(src)):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    hops: list[str | None] = [src]
    try:
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        udp.bind((plan.loopback[src], sport))
        target = plan.loopback[dst]
        for ttl in range(1, max_ttl + 1):
            udp.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            udp.sendto(b"aft-trace" + bytes([ttl]), (target, TRACE_DPORT))
            hop, done = _await_icmp(icmp, plan, sport, timeout_s)
            hops.append(hop)
            if done:
                return hops
        raise RuntimeError(f"trace {src} -> {dst}: no answer from {dst} "
                           f"within {max_ttl} hops: {hops}")
    finally:
        udp.close()
        icmp.close()


def _await_icmp(icmp: socket.socket, plan: AddressPlan, sport: int,
                timeout_s: float) -> tuple[str | None, bool]:
    """The node that answered our probe, and whether it was the destination."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not readable(icmp.fileno(), left):
            break
        packet, (addr, _) = icmp.recvfrom(65535)
        ihl = (packet[0] & 0x0F) * 4
        kind, code = packet[ihl], packet[ihl + 1]
        inner = packet[ihl + 8:]
        if len(inner) < 28:
            continue
        inner_ihl = (inner[0] & 0x0F) * 4
        inner_sport, inner_dport = struct.unpack("!HH", inner[inner_ihl:inner_ihl + 4])
        if inner[9] != socket.IPPROTO_UDP or inner_sport != sport \
                or inner_dport != TRACE_DPORT:
            continue
        if kind == ICMP_TIME_EXCEEDED:
            return plan.owner(addr), False
        if kind == ICMP_DEST_UNREACH and code == ICMP_PORT_UNREACH:
            return plan.owner(addr), True
    return None, False
