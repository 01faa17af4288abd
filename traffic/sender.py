"""Raw sender: patched template frames out of an AF_PACKET socket inside a node's namespace.

    template (scapy, once) ─ buffer ─▶ patcher(psn, sport, ts) ─▶ send() ─▶ <port> ─▶ htb ─▶ veth

The socket is opened inside the node's namespace and bound to one port; frames go to
the port's egress qdisc, so the fabric's shaping applies (a full class makes send()
block once the socket buffer is full; a full queue makes it fail with ENOBUFS, which
is counted as a local drop).

One send(2) per frame: sendmmsg(2) through ctypes (16 to 64 frames per call) was
measured within noise of it (about 5 % faster at 4 KiB frames), so it is not used; the
kernel's per-frame work (skb, copy, veth, the receiver's softirq) dominates.
"""

from __future__ import annotations

import errno
import itertools
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fabric import netns
from traffic.packets import DEFAULT_PRIORITY, PSN_MASK, Addresses, Template, now_ns

PROTO_NONE = 0      # a send-only packet socket: receives nothing
SO_SNDBUFFORCE = 32  # <asm-generic/socket.h>; Python's socket module lacks it
OFFSET_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class SendReport:
    packets: int
    bytes: int
    elapsed_s: float
    dropped: int = 0    # refused by the local queue (ENOBUFS)

    @property
    def pps(self) -> float:
        return self.packets / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def gbps(self) -> float:
        """Frame bits (Ethernet header included) per second, in 10^9 bit/s."""
        return self.bytes * 8 / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0


class RawSender:
    """An AF_PACKET/SOCK_RAW socket bound to `ifname` in namespace `namespace`.

    `namespace` is the full name (`fabric.ns(node)`), or None for the caller's own.
    `priority` sets SO_PRIORITY (the skb priority tc and PCP mapping see).
    """

    def __init__(self, ifname: str, namespace: str | None = None, *,
                 priority: int | None = DEFAULT_PRIORITY, sndbuf_bytes: int | None = None):
        self.ifname = ifname
        self.namespace = namespace
        self.priority = priority
        self.sndbuf_bytes = sndbuf_bytes
        self.sock: socket.socket | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> RawSender:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> RawSender:
        if self.namespace is None:
            self.sock = self._make_socket()
        else:
            with netns.entered(self.namespace):
                self.sock = self._make_socket()
        return self

    def _make_socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, PROTO_NONE)
        try:
            if self.priority is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, self.priority)
            if self.sndbuf_bytes:
                sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, self.sndbuf_bytes)
            sock.bind((self.ifname, PROTO_NONE))
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _socket(self) -> socket.socket:
        if self.sock is None:
            raise RuntimeError("sender is not open")
        return self.sock

    # -- sending -----------------------------------------------------------------------
    def send(self, frames: Iterable[bytes | bytearray | memoryview]) -> SendReport:
        """Send frames as they are, one system call each."""
        send = self._socket().send
        packets = nbytes = dropped = 0
        t0 = time.perf_counter()
        for frame in frames:
            try:
                nbytes += send(frame)
                packets += 1
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                dropped += 1
        return SendReport(packets, nbytes, time.perf_counter() - t0, dropped)

    def blast(self, template: Template, count: int, *, psn: int = 0, sport: int | None = None,
              entropies: Sequence[int] | None = None, msg_id: int = 0) -> SendReport:
        """Send `count` packets of `template`, each patched with its own PSN, stamp, ICRC.

        PSNs run from `psn` (wrapping at 2^24); the stamp carries the send time
        (`packets.now_ns`), `msg_id` and the byte offset (i x payload). The UDP source
        port is `sport` (default: the template's), or cycles through `entropies`
        (one per packet: spraying).
        """
        if count <= 0:
            return SendReport(0, 0, 0.0)
        if entropies is None:
            entropies = [template.sport if sport is None else sport]
        send = self._socket().send
        buf = template.buffer()
        patch = template.patcher(buf)
        clock, size = now_ns, template.payload_bytes
        frame_bytes = len(buf)
        dropped = 0
        t0 = time.perf_counter()
        for i, port in zip(range(count), itertools.cycle(entropies)):  # cycle: C speed
            patch((psn + i) & PSN_MASK, port, clock(), msg_id, (i * size) & OFFSET_MASK)
            try:
                send(buf)
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                dropped += 1
        elapsed = time.perf_counter() - t0
        sent = count - dropped
        return SendReport(sent, sent * frame_bytes, elapsed, dropped)


# -- where a frame goes in a fabric ------------------------------------------------------
def addresses_between(fabric, src: str, dst: str) -> tuple[str, Addresses]:
    """(src's egress port, Addresses) for frames from node src to node dst's loopback.

    The destination MAC is the next hop's port facing src (the first of the ECMP next
    hops if there are several: a raw socket bypasses the sender's routing).
    """
    if dst in fabric.topo.graph.adj[src]:
        hop = dst
    else:
        hops = fabric.routes[src].get(dst)
        if not hops:
            raise ValueError(f"no route from {src} to {dst}")
        hop = hops[0]
    port = fabric.plan.port(src, hop)
    return port.ifname, Addresses(src_mac=_mac(fabric, src, port.ifname),
                                  dst_mac=_mac(fabric, hop, port.peer_ifname),
                                  src_ip=fabric.plan.loopback[src],
                                  dst_ip=fabric.plan.loopback[dst])


def _mac(fabric, node: str, ifname: str) -> str:
    with fabric.ipr(node) as ipr:
        (link,) = ipr.get_links(ifname=ifname)
        return link.get_attr("IFLA_ADDRESS")
