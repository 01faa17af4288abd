"""Port: one AF_PACKET socket bound to one egress port; patched template frames out of it.

    template (scapy, once) ─ buffer ─▶ patcher(psn, sport, ts, ...) ─▶ send(2) ─▶ <port>
        ─▶ htb ─▶ bfifo ─▶ veth

The socket is opened in the caller's namespace, or inside `namespace` (then bound to
the port there); frames go to the port's egress qdisc, so the fabric's shaping applies.
Two ways to drive it, one socket setup and one policy for refused frames:

  - blocking (`send`, `blast`: benchmarks and tests): a shaped class paces the sender
    (send blocks once the socket buffer is full);
  - non-blocking (`push`, `flush`: the agent's event loop): a frame the socket cannot
    take now is kept, in order, and sent when there is room (`pending`, `blocked`).

Refused frames: a full port queue (ENOBUFS) keeps the frame and retries after
ENOBUFS_RETRY_NS, so the sender never drops; a port whose link is down (ENETDOWN,
ENXIO) loses the frame, as a NIC whose link failed does (counted in `down_drops`;
recovery is the transport's job). Any other error is raised.

One send(2) per frame: sendmmsg(2) through ctypes (16 to 64 frames per call) was
measured within noise of it (about 5 % faster at 4 KiB frames), so it is not used; the
kernel's per-frame work (skb, copy, veth, the receiver's softirq) dominates. The send
loops stay inline (no call per frame beyond send itself): a Python call costs ~2 % of
the per-frame budget at 300k frames/s. Compiled, the agent's ports (`push`, `flush`)
call send(2) directly (`direct`, traffic/port.pxd): an errno, no Python call or
exception per frame.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import itertools
import os
import socket
import struct
import termios
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import cython

from fabric import netns
from topologies import units
from traffic.packets import DEFAULT_PRIORITY, PSN_MASK, Template, now_ns

PROTO_NONE = 0                       # a send-only packet socket: receives nothing
SO_SNDBUFFORCE = 32                  # <asm-generic/socket.h>; Python's socket module lacks it
OFFSET_MASK = 0xFFFFFFFF             # the stamp's byte offset is 32 bits (wraps at 4 GiB)
ENOBUFS_RETRY_NS = 200_000           # a full port queue: retry after 0.2 ms
LINK_DOWN_ERRNOS = (errno.ENETDOWN, errno.ENXIO)   # sending on a port whose link is down


@dataclass(frozen=True)
class SendReport:
    packets: int
    bytes: int
    elapsed_s: float
    dropped: int = 0    # lost because the port's link was down

    @property
    def pps(self) -> float:
        return self.packets / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def gbps(self) -> float:
        """Frame bits (Ethernet header included) per second, in 10^9 bit/s."""
        return self.bytes * 8 / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0


class Port:
    """An AF_PACKET/SOCK_RAW socket bound to `ifname`; see the module docstring.

    `namespace`: the full name (`fabric.ns(node)`), or None for the caller's own.
    `priority` sets SO_PRIORITY (the skb priority tc and PCP mapping see); `sndbuf_bytes`
    the socket buffer (default: the kernel's); `rate_mbps` the port's rate, for the wire
    clock; `blocking` picks the way it is driven.

    The wire clock (non-blocking ports with a rate): `free_at` estimates when the wire
    has sent every frame handed to the kernel, at the port's rate (flowlet gaps ask it).
    Starvation is judged on a second clock, `drain_at`, that runs each frame at its
    path's bottleneck rate (`push(..., path_ns_per_byte)`): a frame on a fast port (an
    NVLink hop) whose path then crosses a slow rail keeps that rail busy far longer
    than its own wire, and an agent that comes back after the fast wire went quiet but
    before the rail ran dry starved nothing. `busy_ns` adds up the frames' time on that
    clock. A port left with frames it could not hand over (`pending`) has demand since
    `demand_since`; if the agent hands them over only after `drain_at`, the path stood
    idle meanwhile through the emulator's fault: `starved_ns` (the fidelity verdict's
    first figure). Where flows of different bottlenecks share a port the clock adds
    their times one after the other, which can only make it later (never counts
    starvation that was not). The estimate says nothing when the kernel had
    refused frames (`blocked`: socket buffer or queue full), nor when a port held by PFC
    (or sharing its wire with forwarded traffic) drains later than `free_at`: so before
    any idle time is counted, the kernel is asked (`outq`, SIOCOUTQ: bytes of this
    socket still queued) and only an empty queue counts as starvation. A pause is the
    network's; an agent that woke late after its queue drained is the emulator's. Frames
    the kernel refused wait on the network until it takes them again: the demand of a
    blocked port starts when the agent may send again (`flush`: when select found room
    in the socket, or at the retry time the agent set after a full queue), not when the
    kernel refused, since how long a pause held the queue is the network's time. (An
    agent whose select itself returned late is not seen here; the verdict's timer lags
    and process load see it.)
    """

    __slots__ = ("ifname", "blocking", "sock", "fd", "direct", "send_frame", "pending",
                 "blocked", "retry_ns", "frames", "eagain", "enobufs", "down_drops", "ns_per_byte",
                 "free_at", "drain_at", "busy_ns", "starved_ns", "demand_since", "outq",
                 "pending_ns", "wire", "members", "name")

    def __init__(self, ifname: str, *, namespace: str | None = None,
                 priority: int | None = DEFAULT_PRIORITY, sndbuf_bytes: int | None = None,
                 rate_mbps: float | None = None, blocking: bool = False,
                 wire: Port | None = None, name: str | None = None):
        self.ifname = ifname
        self.name = name or ifname
        self.blocking = blocking
        self.ns_per_byte = units.ns_per_byte(rate_mbps) if rate_mbps else 0.0
        self.free_at = self.drain_at = 0
        self.busy_ns = self.starved_ns = 0.0
        self.demand_since = 0
        if namespace is None:
            self.sock = _packet_socket(ifname, priority, sndbuf_bytes, blocking)
        else:
            with netns.entered(namespace):
                self.sock = _packet_socket(ifname, priority, sndbuf_bytes, blocking)
        self.send_frame = self.sock.send
        self.fd = self.sock.fileno()
        self.direct = cython.compiled and not blocking   # send(2) from C (_send)
        self.outq = functools.partial(queued_bytes, self.fd)
        self.pending: deque[bytes] = deque()
        self.pending_ns: deque[float] = deque()    # each held frame's path ns per byte
        self.blocked = False
        self.retry_ns = 0
        self.frames = self.eagain = self.enobufs = self.down_drops = 0
        # one wire, several queues: the first Port of an egress keeps the clocks for all
        self.wire = self if wire is None else wire
        self.members = [self]
        if wire is not None:
            wire.members.append(self)

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Port:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def _lost(self, err: int) -> bool:
        """A send was refused with errno `err`: True if the frame is lost (the link is
        down), False if the port queue is full (ENOBUFS: keep the frame, retry); counted;
        others raise."""
        if err in LINK_DOWN_ERRNOS:
            self.down_drops += 1
            return True
        if err != errno.ENOBUFS:
            raise OSError(err, f"send on {self.ifname}: {os.strerror(err)}")
        self.enobufs += 1
        return False

    def _send(self, frame) -> int:
        """Hand `frame` (bytes or bytearray) to the kernel: 0, or the errno refusing it
        (EAGAIN: the socket buffer is full)."""
        if self.direct:
            return send_now(self.fd, frame)     # noqa: F821 (traffic/port.pxd, compiled)
        try:
            self.send_frame(frame)
        except OSError as exc:
            return exc.errno
        return 0

    # -- blocking: benchmarks and tests ------------------------------------------------
    def _resend(self, frame) -> bool:
        """Retry a frame the full port queue refused until it is taken (True) or the
        link goes down (False)."""
        while True:
            time.sleep(ENOBUFS_RETRY_NS / 1e9)
            try:
                self.send_frame(frame)
                return True
            except OSError as exc:
                if self._lost(exc.errno):
                    return False

    def _check_blocking(self) -> None:
        if not self.blocking:
            raise RuntimeError(f"port {self.ifname} is non-blocking: use push/flush")

    def send(self, frames: Iterable[bytes | bytearray | memoryview]) -> SendReport:
        """Send frames as they are, one system call each."""
        self._check_blocking()
        send = self.send_frame
        packets = nbytes = dropped = 0
        t0 = time.perf_counter()
        for frame in frames:
            try:
                send(frame)
            except OSError as exc:
                if self._lost(exc.errno) or not self._resend(frame):
                    dropped += 1
                    continue
            nbytes += len(frame)
            packets += 1
        self.frames += packets
        return SendReport(packets, nbytes, time.perf_counter() - t0, dropped)

    def blast(self, template: Template, count: int, *, psn: int = 0, sport: int | None = None,
              entropies: Sequence[int] | None = None, msg_id: int = 0) -> SendReport:
        """Send `count` packets of `template`, each patched with its own PSN, stamp, ICRC.

        PSNs run from `psn` (wrapping at 2^24); the stamp carries the send time
        (`packets.now_ns`), `msg_id` and the byte offset (i x payload). The UDP source
        port is `sport` (default: the template's), or cycles through `entropies`
        (one per packet: spraying).
        """
        self._check_blocking()
        if count <= 0:
            return SendReport(0, 0, 0.0)
        if entropies is None:
            entropies = [template.sport if sport is None else sport]
        send = self.send_frame
        buf = template.buffer()
        patch = template.patcher(buf)
        clock, size = now_ns, template.payload_bytes
        dropped = 0
        t0 = time.perf_counter()
        for i, port in zip(range(count), itertools.cycle(entropies)):  # cycle: C speed
            patch((psn + i) & PSN_MASK, port, clock(), msg_id, (i * size) & OFFSET_MASK)
            try:
                send(buf)
            except OSError as exc:
                if self._lost(exc.errno) or not self._resend(buf):
                    dropped += 1
        elapsed = time.perf_counter() - t0
        sent = count - dropped
        self.frames += sent
        return SendReport(sent, sent * len(buf), elapsed, dropped)

    # -- non-blocking: the agent's event loop ------------------------------------------
    def push(self, frame: bytearray, now: int, path_ns_per_byte: float = 0.0) -> None:
        """Send a frame, or keep a copy to send when the socket has room again.
        `path_ns_per_byte`: at its path's bottleneck rate (0: this port's)."""
        if self.pending:
            self.pending.append(bytes(frame))
            self.pending_ns.append(path_ns_per_byte)
            return
        if self.wire.demand_since:
            self._idle_since_demand(now)
        err = self._send(frame)
        if err:
            if not self._refused(err, now):
                self.pending.append(bytes(frame))
                self.pending_ns.append(path_ns_per_byte)
            return
        self._clock(len(frame), now, path_ns_per_byte)

    def _refused(self, err: int, now: int) -> bool:
        """The kernel refused a frame with errno `err`: True if it is lost (the link is
        down); else the port is blocked until select finds room (EAGAIN) or until its
        retry time (ENOBUFS: the queue is full)."""
        if err == errno.EAGAIN:
            self.eagain += 1
        elif self._lost(err):
            return True
        else:
            self.retry_ns = now + ENOBUFS_RETRY_NS
        self.blocked = True
        return False

    def _clock(self, nbytes: int, now: int, path_ns_per_byte: float) -> None:
        """A frame of `nbytes` went to the kernel at `now`: both clocks (the wire's) run on."""
        w = self.wire
        self.frames += 1
        wire = nbytes * w.ns_per_byte
        w.free_at = (now if now > w.free_at else w.free_at) + int(wire)
        drain = nbytes * path_ns_per_byte if path_ns_per_byte > w.ns_per_byte else wire
        w.busy_ns += drain
        w.drain_at = (now if now > w.drain_at else w.drain_at) + int(drain)

    def flush(self, now: int) -> bool:
        """Send what is held; True when nothing is left. Called when the agent may send
        again: select found room (EAGAIN) or the retry time came (ENOBUFS)."""
        pending, pending_ns = self.pending, self.pending_ns
        allowed = self.retry_ns or now      # see the class: the network's wait ends here
        self.retry_ns = 0
        w = self.wire
        if w.demand_since:
            if self.blocked and w.demand_since < allowed:
                w.demand_since = allowed
            self._idle_since_demand(now)
        while pending:
            err = self._send(pending[0])
            if err:
                if not self._refused(err, now):
                    return False
                pending.popleft()
                pending_ns.popleft()
                continue
            self._clock(len(pending.popleft()), now, pending_ns.popleft())
        self.blocked = False
        return True

    def wire_until(self, nbytes: int) -> int:
        """When the wire will have sent what this port holds, a frame of `nbytes` just
        pushed included (for flowlet gaps; a port held by PFC or slowed by a lane
        failure drains later than this)."""
        w = self.wire
        return w.free_at + int(len(self.pending) * nbytes * w.ns_per_byte)

    def waiting(self, now: int, ready: bool = False) -> None:
        """The agent leaves this port with frames it holds, or (`ready`) with a flow that
        could still send: from now on they wait on the agent, not the network."""
        w = self.wire
        if (ready or self.pending) and not w.demand_since:
            w.demand_since = now

    def _idle_since_demand(self, now: int) -> None:
        """Frames go out again at `now`: add the wire's idle time since the demand (after
        a refusal, only if the kernel's queue ran dry meanwhile; see the class). The
        clocks are the wire's: every queue of the egress (`members`) counts in its
        kernel queue."""
        w = self.wire
        drained = w.drain_at
        idle = now - (drained if drained > w.demand_since else w.demand_since)
        if self.blocked or idle > 0:
            queued = w.queued()
            if queued:               # still sending (or paused): the wire was never idle
                w.free_at = now + int(queued * w.ns_per_byte)
                if w.free_at > drained:
                    w.drain_at = w.free_at
                w.demand_since = 0
                return
        if idle > 0:
            w.starved_ns += idle
        w.demand_since = 0

    def queued(self) -> int:
        """Bytes the sockets of this wire's queues handed the kernel and it has not sent."""
        if len(self.members) == 1:
            return self.outq()
        total = 0
        for p in self.members:
            total += p.outq()
        return total

    def counters(self) -> dict[str, int]:
        """Its own counts; the wire's clocks on the Port that keeps them (others: 0)."""
        return {"frames": self.frames, "eagain": self.eagain, "enobufs": self.enobufs,
                "down_drops": self.down_drops, "pending": len(self.pending),
                "busy_ns": int(self.busy_ns), "starved_ns": int(self.starved_ns)}


def dest_queue(ifname: str, peer: str) -> str:
    """The name of an egress's queue for the frames toward one peer (a NIC's queue per
    destination: nic_queues "destination")."""
    return f"{ifname}>{peer}"


def ack_queue(ifname: str) -> str:
    """The name of an egress's queue for ACKs, NAKs and CNPs (ack_class "control")."""
    return f"{ifname}+acks"


def nic_ports(cfg) -> dict[str, Port]:
    """An agent's send queues by name (`cfg`: its traffic.agent_config.AgentConfig),
    opened in the caller's namespace: one per egress port (named by it), which keeps the
    wire's clocks; with nic_queues "destination" one more per egress and peer it sends to
    or answers (dest_queue), and with an ACK DSCP (ack_class "control") one for ACKs,
    NAKs and CNPs (ack_queue). Each is a socket of its own, so its buffer and the frames
    it holds are its own; all of an egress share its wire clock (Port.wire)."""
    peers = set()
    if cfg.nic_queues == "destination":
        for step in cfg.steps:
            peers.update(t["dst"] for t in step.get("sends", ()))
            peers.update(t["src"] for t in step.get("recvs", ()))
    ports: dict[str, Port] = {}
    used = {i for ifnames in cfg.routes.values() for i in ifnames}
    for ifname in sorted(used):
        opts = {"priority": cfg.priority, "sndbuf_bytes": cfg.sndbuf_bytes,
                "rate_mbps": cfg.ports[ifname].get("rate_mbps")}
        wire = ports[ifname] = Port(ifname, **opts)
        names = [dest_queue(ifname, p) for p in sorted(peers) if ifname in cfg.routes[p]]
        if cfg.ack_dscp is not None:
            names.append(ack_queue(ifname))
        for name in names:
            ports[name] = Port(ifname, **opts, wire=wire, name=name)
    return ports


def any_blocked(ports: list[Port]) -> bool:
    """Whether a port of `ports` holds frames the kernel refused (a loop, not any() of a
    generator: the agent's compiled methods cannot hold one)."""
    for p in ports:  # noqa: SIM110 (a loop: compiled, a C loop over typed ports)
        if p.blocked:
            return True
    return False


def any_pending(ports: list[Port]) -> bool:
    """Whether a port of `ports` holds frames not yet sent."""
    for p in ports:  # noqa: SIM110
        if p.pending:
            return True
    return False


def queued_bytes(fd: int) -> int:
    """Bytes this socket has handed to the kernel that are not sent yet (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]


def _packet_socket(ifname: str, priority: int | None, sndbuf_bytes: int | None,
                   blocking: bool) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, PROTO_NONE)
    try:
        if priority is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)
        if sndbuf_bytes:
            sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sndbuf_bytes)
        sock.bind((ifname, PROTO_NONE))
        sock.setblocking(blocking)
    except BaseException:
        sock.close()
        raise
    return sock
