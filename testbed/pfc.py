"""PFC (802.1Qbb): pause frames on the wire, XOFF/XON per ingress port, headroom, watchdog.

What is real and what is emulated:

    switch S, egress port e (lossless queue: tbf 13: under htb class 1:13, fabric.shaping)
      │  occupancy polled every poll_ms (one RTM_GETQDISC dump per switch namespace)
      ▼
    occupancy charged to each ingress port i of S, in proportion to the lossless bytes
    its upstream U sent into S (U's own class counters, an EWMA frozen while paused)
      │  passes XOFF
      ▼
    a real PFC frame (01:80:C2:00:00:01, 0x8808, opcode 0x0101, class-enable vector,
    eight pause times) leaves S's port i on the wire (AF_PACKET, qdisc bypassed)
      │  U's kernel has no 802.1Qbb MAC: the controller emulates its reaction
      ▼
    U's port toward S holds its lossless class (tbf 13: to a trickle rate); the lossy
    class 1:10 keeps sending. A host's agent then blocks on its socket: the NIC stops.
      │  occupancy falls under XON: a frame with pause time 0, U's class reopens
      ▼  (a refresh frame every half pause; an unrefreshed pause expires with its quanta)

Per ingress port, XOFF + headroom must fit: headroom = link rate x (reaction time + 2 x
propagation) + 2 frames (the frame U is sending when the pause lands, and at most one
more that leaves U's held bucket). The reaction time is measured (calibrated at start,
then every pause); the report says when the buffer cannot cover it rather than letting
the run drop silently. With PFC off the same layout and the same polling run, nothing
pauses, and the lossless queues overflow and drop.

The watchdog reports a port held longer than `watchdog_ms` (a pause storm); with
`watchdog_action="drop"` the upstream then ignores pauses on that link for
`watchdog_ms` (its packets flow and the congested queue drops), as switch watchdogs do.

The poller reads the dump with a raw netlink socket parsed with `struct`: pyroute2's
parser costs ~2-3 ms per namespace here, more than the whole reaction budget. Every
change to the kernel (layout, hold, release) goes through pyroute2 (fabric.shaping).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import socket
import statistics
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fabric import netns
from fabric.shaping import (
    ETH_HEADER_BYTES,
    KICK_PRIORITY,
    LOSSLESS_CLASS,
    LOSSLESS_HANDLE,
    _tbf_params,
    shape_lossless,
)
from topologies.spec import MTU_BYTES
from traffic.packets import DEFAULT_DSCP, DEFAULT_PRIORITY

# -- 802.1Qbb -------------------------------------------------------------------------
PFC_DST_MAC = "01:80:c2:00:00:01"
ETHERTYPE_MAC_CONTROL = 0x8808
OPCODE_PFC = 0x0101
QUANTUM_BITS = 512               # one pause quantum = 512 bit times at the link rate
MAX_QUANTA = 0xFFFF
PFC_FRAME_BYTES = 60             # the minimum Ethernet frame (without FCS)
SWITCH_ROLES = ("leaf", "spine", "nvswitch", "plane")
PROPAGATION_S_PER_M = 5e-9       # light in fibre/copper: ~5 ns per metre
SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
KICK_ETHERTYPE = 0x88B5          # IEEE local experimental: the frame is dropped by tc


def pfc_frame(src_mac: str, pause: dict[int, int]) -> bytes:
    """A PFC frame pausing priority p for pause[p] quanta (0 = resume), built by scapy."""
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether
    fields = {}
    for prio, quanta in pause.items():
        if not 0 <= prio <= 7:
            raise ValueError(f"priority must be 0..7, got {prio}")
        if not 0 <= quanta <= MAX_QUANTA:
            raise ValueError(f"pause quanta must be 0..{MAX_QUANTA}, got {quanta}")
        fields[f"c{prio}_enabled"] = 1
        fields[f"c{prio}_pause_time"] = quanta
    pkt = (Ether(dst=PFC_DST_MAC, src=src_mac, type=ETHERTYPE_MAC_CONTROL)
           / MACControlClassBasedFlowControl(**fields))
    raw = bytes(pkt)
    return raw + b"\0" * (PFC_FRAME_BYTES - len(raw))


def parse_pfc_frame(frame: bytes) -> dict | None:
    """(enable vector, pause times) of a PFC frame; None if it is not one."""
    if len(frame) < 34:
        return None
    ethertype, opcode, vector = struct.unpack_from("!HHH", frame, 12)
    if frame[:6] != bytes.fromhex(PFC_DST_MAC.replace(":", "")) or \
            ethertype != ETHERTYPE_MAC_CONTROL or opcode != OPCODE_PFC:
        return None
    return {"src": frame[6:12].hex(":"), "enable_vector": vector,
            "pause_quanta": list(struct.unpack_from("!8H", frame, 18))}


def quanta_s(quanta: int, rate_mbps: float) -> float:
    """How long `quanta` pause quanta last on a link of `rate_mbps`."""
    return quanta * QUANTUM_BITS / (rate_mbps * 1e6)


# -- thresholds -----------------------------------------------------------------------
@dataclass(frozen=True)
class Thresholds:
    """Per ingress port, in bytes of lossless occupancy charged to that port."""

    xoff_bytes: int
    xon_bytes: int
    headroom_bytes: int
    ok: bool = True          # XOFF + headroom of every ingress fits the buffer
    note: str = ""


def headroom_bytes(rate_mbps: float, reaction_s: float, mtu: int = MTU_BYTES,
                   length_m: float = 0.0) -> int:
    """Bytes that still arrive after XOFF: rate x (reaction + round trip) + 2 frames."""
    frame = mtu + ETH_HEADER_BYTES
    in_flight = rate_mbps * 1e6 / 8 * (reaction_s + 2 * length_m * PROPAGATION_S_PER_M)
    return math.ceil(in_flight) + 2 * frame


def thresholds_for(buffer_bytes: int, fan_in: int, rate_mbps: float, reaction_s: float,
                   mtu: int = MTU_BYTES, length_m: float = 0.0, xoff_bytes: int | None = None,
                   xon_bytes: int | None = None,
                   headroom: int | None = None) -> Thresholds:
    """XOFF/XON/headroom for one ingress port of a switch with `fan_in` ingress ports
    that may all feed one egress buffer of `buffer_bytes`.

    Default XOFF = buffer / fan_in - headroom (all ingress ports at XOFF plus their
    headroom fill the buffer exactly); XON = XOFF / 2. Given values are kept; `ok` is
    False (with a note saying what would fit) when fan_in x (XOFF + headroom) > buffer.
    """
    frame = mtu + ETH_HEADER_BYTES
    fan_in = max(1, fan_in)
    room = headroom if headroom is not None else headroom_bytes(rate_mbps, reaction_s,
                                                                mtu, length_m)
    xoff = xoff_bytes if xoff_bytes is not None else buffer_bytes // fan_in - room
    note = ""
    ok = xoff >= frame and fan_in * (xoff + room) <= buffer_bytes
    if not ok:
        need = fan_in * (max(xoff, frame) + room)
        note = (f"buffer {buffer_bytes} B cannot hold {fan_in} x (XOFF {max(xoff, frame)} B"
                f" + headroom {room} B for {reaction_s * 1e3:.2f} ms at {rate_mbps:g} Mbit/s)"
                f": drops are possible; needs >= {need} B")
        xoff = max(xoff, frame)
    xon = xon_bytes if xon_bytes is not None else xoff // 2
    if not 0 <= xon <= xoff:
        raise ValueError(f"XON ({xon} B) must be between 0 and XOFF ({xoff} B)")
    return Thresholds(int(xoff), int(xon), int(room), ok, note)


@dataclass
class PfcConfig:
    enabled: bool = True
    priority: int = DEFAULT_PRIORITY
    dscp: int = DEFAULT_DSCP
    xoff_bytes: int | None = None
    xon_bytes: int | None = None
    headroom_bytes: int | None = None
    reaction_ms: float | None = None      # None: measured at start (calibration)
    poll_ms: float = 1.0
    share_ms: float = 10.0                # how often upstream byte shares are updated
    quanta: int = MAX_QUANTA
    watchdog_ms: float = 500.0
    watchdog_action: str = "report"       # or "drop"
    sample_ms: float = 20.0               # timeline resolution
    rt_priority: int | None = 10          # SCHED_FIFO for the controller thread (None: no)

    def __post_init__(self) -> None:
        if self.watchdog_action not in ("report", "drop"):
            raise ValueError(f"watchdog_action must be 'report' or 'drop', "
                             f"got {self.watchdog_action!r}")
        if not 0 <= self.priority <= 7:
            raise ValueError(f"priority must be 0..7, got {self.priority}")
        if not 0 < self.quanta <= MAX_QUANTA:
            raise ValueError(f"quanta must be 1..{MAX_QUANTA}, got {self.quanta}")
        if self.poll_ms <= 0:
            raise ValueError(f"poll_ms must be > 0, got {self.poll_ms}")


# -- the lossless layout on every port ------------------------------------------------
def install(fab, dscp: int = DEFAULT_DSCP) -> None:
    """Give every port of the fabric the two-class egress (fabric.shaping)."""
    g = fab.topo.graph
    for node in g.nodes:
        with fab.ipr(node) as ipr:
            for port in fab.plan.ports[node]:
                edge = g.edges[node, port.peer]
                (index,) = ipr.link_lookup(ifname=port.ifname)
                shape_lossless(ipr, index, edge["rate_mbps"], edge["queue_bytes"], dscp)


# -- fast tc statistics ---------------------------------------------------------------
RTM_NEWQDISC, RTM_GETQDISC = 36, 38
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCA_KIND, TCA_STATS2 = 1, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
NLA_TYPE_MASK = 0x3FFF


class QdiscPoller:
    """Backlog, drops and bytes of one qdisc handle on every port of a namespace.

    Opens its netlink socket in the namespace the calling thread is in.
    """

    def __init__(self, handle: int = int(LOSSLESS_HANDLE.rstrip(":"), 16) << 16):
        self.handle = handle
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
        self.sock.bind((0, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.buf = bytearray(1 << 16)
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def poll(self) -> dict[int, tuple[int, int, int]]:
        """{ifindex: (backlog_bytes, drops, sent_bytes)}."""
        self.seq += 1
        req = struct.pack("=IHHII", 36, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP,
                          self.seq, 0) + bytes(20)
        self.sock.send(req)
        out: dict[int, tuple[int, int, int]] = {}
        buf, view = self.buf, memoryview(self.buf)
        unpack = struct.unpack_from
        while True:
            n = self.sock.recv_into(buf)
            off = 0
            while off + 16 <= n:
                length, kind, _, seq, _ = unpack("=IHHII", buf, off)
                if length < 16:
                    return out
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    (err,) = unpack("=i", buf, off + 16)
                    if err:
                        raise OSError(-err, "RTM_GETQDISC dump failed")
                elif kind == RTM_NEWQDISC and seq == self.seq:
                    index, handle = unpack("=iI", buf, off + 20)
                    if handle == self.handle:
                        stats = _stats2(view, off + 36, off + length)
                        if stats is not None:
                            out[index] = stats
                off += (length + 3) & ~3

    def request(self, message: bytes) -> None:
        """Send one pre-encoded request that asks for an ACK; raise on a kernel error."""
        self.seq += 1
        msg = bytearray(message)
        struct.pack_into("=I", msg, 8, self.seq)
        self.sock.send(msg)
        while True:
            n = self.sock.recv_into(self.buf)
            off = 0
            while off + 16 <= n:
                length, kind, _, seq, _ = struct.unpack_from("=IHHII", self.buf, off)
                if kind == NLMSG_ERROR and seq == self.seq:
                    (err,) = struct.unpack_from("=i", self.buf, off + 16)
                    if err:
                        raise OSError(-err, f"tc change failed: {os.strerror(-err)}")
                    return
                if length < 16:
                    break
                off += (length + 3) & ~3

    def __enter__(self) -> QdiscPoller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stats2(view: memoryview, off: int, end: int) -> tuple[int, int, int] | None:
    unpack = struct.unpack_from
    while off + 4 <= end:
        nla_len, nla_type = unpack("=HH", view, off)
        if nla_len < 4:
            return None
        if nla_type & NLA_TYPE_MASK == TCA_STATS2:
            sent = backlog = drops = 0
            inner, inner_end = off + 4, off + nla_len
            while inner + 4 <= inner_end:
                ilen, itype = unpack("=HH", view, inner)
                if ilen < 4:
                    break
                itype &= NLA_TYPE_MASK
                if itype == TCA_STATS_BASIC:
                    (sent,) = unpack("=Q", view, inner + 4)
                elif itype == TCA_STATS_QUEUE:
                    _, backlog, drops = unpack("=III", view, inner + 4)
                inner += (ilen + 3) & ~3
            return backlog, drops, sent
        off += (nla_len + 3) & ~3
    return None


def hold_message(index: int, rate_mbps: float, queue_bytes: int, held: bool,
                 mtu: int = MTU_BYTES) -> bytes:
    """The RTM_NEWQDISC 'change' of tbf 13: that hold_lossless() sends, encoded once by
    pyroute2 (its tcmsg and tbf plugin): sent as bytes it costs ~10 us, not ~1 ms."""
    from pyroute2.netlink.rtnl.tcmsg import plugins, tcmsg
    msg = tcmsg()
    msg["index"] = index
    msg["handle"] = int(LOSSLESS_HANDLE.rstrip(":"), 16) << 16
    major, minor = LOSSLESS_CLASS.split(":")
    msg["parent"] = int(major, 16) << 16 | int(minor, 16)
    params = _tbf_params(rate_mbps, queue_bytes, held, mtu)
    msg["attrs"] = [["TCA_KIND", "tbf"],
                    ["TCA_OPTIONS", plugins["tbf"].get_parameters(dict(params))]]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg.encode()
    return bytes(msg.data)


# -- the controller -------------------------------------------------------------------
@dataclass
class Ingress:
    """One switch port seen as an ingress: its upstream, thresholds and pause state."""

    switch: str
    ifname: str
    index: int
    upstream: str
    up_ifname: str
    up_index: int
    rate_mbps: float
    queue_bytes: int
    thresholds: Thresholds
    pause_s: float
    hold_msgs: tuple[bytes, bytes] = (b"", b"")   # (release, hold) on the upstream
    weight: float = 0.0            # EWMA of lossless bytes/s from the upstream
    last_up_bytes: int | None = None
    occupancy: float = 0.0
    prev_occupancy: float = 0.0
    paused: bool = False
    paused_since: float = 0.0
    last_frame: float = 0.0
    storm_reported: bool = False
    watchdog_until: float = 0.0


@dataclass
class PortCounters:
    frames_sent: int = 0
    xoff_frames: int = 0
    xon_frames: int = 0
    frames_received: int = 0
    paused_s: float = 0.0
    drops: int = 0
    drops_at_start: int | None = None
    max_backlog_bytes: int = 0
    backlog_bytes: int = 0


@dataclass
class Reaction:
    switch: str
    ifname: str
    t_s: float
    reaction_ms: float            # estimated XOFF crossing -> hold applied upstream
    upper_ms: float               # last poll below XOFF -> hold applied upstream
    frame_ms: float               # crossing -> frame on the wire


class PfcController:
    """Polls every switch's lossless queues and pauses upstream ports (see module doc).

    start()/stop(); report() afterwards. One thread owns every socket it uses.
    """

    def __init__(self, fab, config: PfcConfig | None = None):
        self.fab = fab
        self.cfg = config or PfcConfig()
        g = fab.topo.graph
        self.switches = [n for n in g.nodes if g.nodes[n].get("role") in SWITCH_ROLES]
        self.ingress: list[Ingress] = []
        self.counters: dict[tuple[str, str], PortCounters] = {}
        self.reactions: list[Reaction] = []
        self.storms: list[dict] = []
        self.timeline: list[dict] = []
        self.calibration: dict = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._manual: list[tuple[str, str, bool]] = []
        self._lock = threading.Lock()
        self.t0 = 0.0
        self.polls = 0
        self.late_polls = 0          # polls more than 3 periods + 1 ms after the last
        self.max_gap_s = 0.0
        self.gaps: list[tuple[float, float]] = []    # (t_s, gap_ms) of late polls
        self.cpu_s = 0.0
        self.wall_s = 0.0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> PfcController:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pfc", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=60)
        if self._error:
            raise self._error
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def __enter__(self) -> PfcController:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pause(self, switch: str, ifname: str, on: bool = True) -> None:
        """Force a pause (on) or its end on one switch ingress port (tests, demos)."""
        with self._lock:
            self._manual.append((switch, ifname, on))

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        from pyroute2 import IPRoute
        fab, g = self.fab, self.fab.topo.graph
        self.iprs: dict = {}
        self.pollers: dict[str, QdiscPoller] = {}
        self.frame_socks: dict[tuple[str, str], socket.socket] = {}
        self.kick_socks: dict[tuple[str, str], socket.socket] = {}
        try:
            index: dict[str, dict[str, int]] = {}
            macs: dict[str, dict[str, str]] = {}
            for node in g.nodes:
                with netns.entered(fab.ns(node)):
                    self.iprs[node] = IPRoute()
                    self.pollers[node] = QdiscPoller()
                links = self.iprs[node].get_links()
                index[node] = {lk.get_attr("IFLA_IFNAME"): lk["index"] for lk in links}
                macs[node] = {lk.get_attr("IFLA_IFNAME"): lk.get_attr("IFLA_ADDRESS")
                              for lk in links}
            self._calibrate(index)
            for node in g.nodes:
                for port in fab.plan.ports[node]:
                    self.counters[(node, port.ifname)] = PortCounters()
            for s in self.switches:
                fan_in = max(1, len(fab.plan.ports[s]) - 1)
                for port in fab.plan.ports[s]:
                    edge = g.edges[s, port.peer]
                    th = thresholds_for(
                        edge["queue_bytes"], fan_in, edge["rate_mbps"],
                        self.calibration["reaction_ms_assumed"] / 1e3,
                        length_m=edge.get("length_m", 0.0), xoff_bytes=self.cfg.xoff_bytes,
                        xon_bytes=self.cfg.xon_bytes, headroom=self.cfg.headroom_bytes)
                    self.ingress.append(Ingress(
                        s, port.ifname, index[s][port.ifname], port.peer, port.peer_ifname,
                        index[port.peer][port.peer_ifname], edge["rate_mbps"],
                        edge["queue_bytes"], th, quanta_s(self.cfg.quanta, edge["rate_mbps"]),
                        tuple(hold_message(index[port.peer][port.peer_ifname],
                                           edge["rate_mbps"], edge["queue_bytes"], held)
                              for held in (False, True))))
                    with netns.entered(fab.ns(s)):
                        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                    sock.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
                    sock.bind((port.ifname, 0))
                    self.frame_socks[(s, port.ifname)] = sock
                    with netns.entered(fab.ns(port.peer)):
                        kick = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                    kick.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, KICK_PRIORITY)
                    kick.bind((port.peer_ifname, 0))
                    kick.setblocking(False)
                    self.kick_socks[(port.peer, port.peer_ifname)] = kick
            prio = self.cfg.priority
            self.frames = {}
            for s in self.switches:
                for port in fab.plan.ports[s]:
                    mac = macs[s][port.ifname]
                    self.frames[(s, port.ifname)] = (pfc_frame(mac, {prio: self.cfg.quanta}),
                                                     pfc_frame(mac, {prio: 0}))
            self.kick_frame = (b"\xff" * 6 + b"\x02\0\0\0\0\x01"
                               + struct.pack("!H", KICK_ETHERTYPE) + bytes(46))
            self.by_port = {(i.switch, i.ifname): i for i in self.ingress}
        except BaseException as exc:
            self._error = exc
            self._close()
            self._ready.set()
            return
        self.calibration["realtime"] = self._realtime()
        self.t0 = time.monotonic()
        self._ready.set()
        cpu0 = time.thread_time()
        try:
            self._loop()
        except BaseException as exc:  # reported, never silent
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            for ing in self.ingress:       # nothing stays held after the run
                if ing.paused:
                    with contextlib.suppress(Exception):
                        self._release(ing, time.monotonic(), frame=True)
            self.cpu_s = time.thread_time() - cpu0
            self.wall_s = time.monotonic() - self.t0
            self._close()

    def _realtime(self) -> bool:
        """Run this thread SCHED_FIFO: a switch's PFC logic is hardware, never starved by
        the agents. The kernel's RT throttling still leaves the rest of the machine 5 %."""
        if self.cfg.rt_priority is None:
            return False
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.cfg.rt_priority))
        except OSError as exc:
            self.errors.append(f"SCHED_FIFO not available ({exc}); reaction times suffer")
            return False
        return True

    def _close(self) -> None:
        for ipr in self.iprs.values():
            with contextlib.suppress(Exception):
                ipr.close()
        for p in self.pollers.values():
            p.close()
        for sock in [*self.frame_socks.values(), *self.kick_socks.values()]:
            sock.close()

    def _calibrate(self, index: dict[str, dict[str, int]], rounds: int = 20) -> None:
        """Time a poll of every switch and one tc change: the assumed reaction time."""
        sw = self.switches or list(self.pollers)
        t0 = time.perf_counter()
        for _ in range(rounds):
            for s in sw:
                self.pollers[s].poll()
        cycle = (time.perf_counter() - t0) / rounds
        node = sw[0]
        port = self.fab.plan.ports[node][0]
        edge = self.fab.topo.graph.edges[node, port.peer]
        reopen = hold_message(index[node][port.ifname], edge["rate_mbps"],
                              edge["queue_bytes"], held=False)
        t0 = time.perf_counter()
        for _ in range(5):      # an open class reopened: no change in behaviour
            self.pollers[node].request(reopen)
        change = (time.perf_counter() - t0) / 5
        assumed = self.cfg.reaction_ms
        if assumed is None:     # worst case: a full period, a full cycle, the change; x1.5
            assumed = 1.5 * (self.cfg.poll_ms / 1e3 + cycle + change) * 1e3
        self.calibration = {"poll_cycle_ms": round(cycle * 1e3, 3),
                            "tc_change_ms": round(change * 1e3, 3),
                            "reaction_ms_assumed": round(assumed, 3),
                            "switches_polled": len(sw)}

    def _loop(self) -> None:
        cfg = self.cfg
        period = cfg.poll_ms / 1e3
        share_every = cfg.share_ms / 1e3
        sample_every = cfg.sample_ms / 1e3
        next_share = next_sample = next_poll = time.monotonic()
        last_share = None
        switches = self.switches
        hosts = [n for n in self.pollers if n not in switches]
        stats: dict[str, dict[int, tuple[int, int, int]]] = {}
        while not self._stop.is_set():
            t_prev = getattr(self, "_t_last", None)
            now = time.monotonic()
            for s in switches:
                stats[s] = self.pollers[s].poll()
            self.polls += 1
            if now >= next_share:
                for h in hosts:
                    stats[h] = self.pollers[h].poll()
                dt = now - last_share if last_share is not None else None
                self._update_shares(stats, dt)
                last_share = now
                next_share = now + share_every
            self._evaluate(stats, now, t_prev)
            self._manual_requests(now)
            if now >= next_sample:
                self._sample(stats, now)
                next_sample = now + sample_every
            if t_prev is not None:
                gap = now - t_prev
                self.max_gap_s = max(self.max_gap_s, gap)
                if gap > 3 * period + 1e-3:
                    self.late_polls += 1
                    if len(self.gaps) < 50:
                        self.gaps.append((round(t_prev - self.t0, 3), round(gap * 1e3, 1)))
            self._t_last = now
            next_poll += period
            delay = next_poll - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_poll = time.monotonic()
        now = time.monotonic()
        for n in self.pollers:
            stats[n] = self.pollers[n].poll()
        self._sample(stats, now)

    def _update_shares(self, stats: dict, dt: float | None) -> None:
        for ing in self.ingress:
            got = stats.get(ing.upstream, {}).get(ing.up_index)
            if got is None:
                continue
            sent = got[2]
            if ing.last_up_bytes is not None and dt and not ing.paused:
                rate = (sent - ing.last_up_bytes) / dt
                ing.weight = rate if ing.weight == 0 else 0.7 * ing.weight + 0.3 * rate
            ing.last_up_bytes = sent

    def _evaluate(self, stats: dict, now: float, t_prev: float | None) -> None:
        by_switch: dict[str, list[Ingress]] = {}
        for ing in self.ingress:
            by_switch.setdefault(ing.switch, []).append(ing)
        for s, ports in by_switch.items():
            st = stats.get(s, {})
            total_w = sum(p.weight for p in ports)
            for p in ports:
                p.prev_occupancy = p.occupancy
                p.occupancy = 0.0
            for e in ports:
                backlog = st.get(e.index, (0, 0, 0))[0]
                if not backlog:
                    continue
                den = total_w - e.weight
                if den <= 0:
                    continue
                for i in ports:
                    if i is not e and i.weight > 0:
                        i.occupancy += backlog * i.weight / den
            if not self.cfg.enabled:
                continue
            for i in ports:
                self._step(i, now, t_prev)

    def _step(self, ing: Ingress, now: float, t_prev: float | None) -> None:
        th = ing.thresholds
        if now < ing.watchdog_until:
            return
        if not ing.paused:
            if ing.occupancy >= th.xoff_bytes:
                self._xoff(ing, now, t_prev)
            return
        held_s = now - ing.paused_since
        if held_s * 1e3 > self.cfg.watchdog_ms and not ing.storm_reported:
            ing.storm_reported = True
            self.storms.append({"switch": ing.switch, "ifname": ing.ifname,
                                "upstream": ing.upstream, "up_ifname": ing.up_ifname,
                                "t_s": round(now - self.t0, 4),
                                "paused_ms": round(held_s * 1e3, 1),
                                "action": self.cfg.watchdog_action})
            if self.cfg.watchdog_action == "drop":
                self._release(ing, now, frame=True)
                ing.watchdog_until = now + self.cfg.watchdog_ms / 1e3
                return
        if ing.occupancy <= th.xon_bytes:
            self._release(ing, now, frame=True)
        elif now - ing.last_frame >= ing.pause_s / 2:
            self._send(ing, xoff=True, now=now)       # refresh before the quanta expire

    def _send(self, ing: Ingress, xoff: bool, now: float) -> None:
        frame = self.frames[(ing.switch, ing.ifname)][0 if xoff else 1]
        self.frame_socks[(ing.switch, ing.ifname)].send(frame)
        c = self.counters[(ing.switch, ing.ifname)]
        c.frames_sent += 1
        if xoff:
            c.xoff_frames += 1
        else:
            c.xon_frames += 1
        self.counters[(ing.upstream, ing.up_ifname)].frames_received += 1
        ing.last_frame = now

    def _xoff(self, ing: Ingress, now: float, t_prev: float | None) -> None:
        self._send(ing, xoff=True, now=now)
        t_frame = time.monotonic()
        self.pollers[ing.upstream].request(ing.hold_msgs[1])
        t_done = time.monotonic()
        ing.paused, ing.paused_since, ing.storm_reported = True, now, False
        if t_prev is not None:
            occ0, occ1, xoff = ing.prev_occupancy, ing.occupancy, ing.thresholds.xoff_bytes
            frac = (xoff - occ0) / (occ1 - occ0) if occ1 > occ0 else 1.0
            crossing = t_prev + min(1.0, max(0.0, frac)) * (now - t_prev)
            self.reactions.append(Reaction(
                ing.switch, ing.ifname, round(now - self.t0, 4),
                (t_done - crossing) * 1e3, (t_done - t_prev) * 1e3,
                (t_frame - crossing) * 1e3))

    def _release(self, ing: Ingress, now: float, frame: bool) -> None:
        if frame:
            self._send(ing, xoff=False, now=now)
        self.pollers[ing.upstream].request(ing.hold_msgs[0])
        with contextlib.suppress(OSError):   # run the upstream's qdisc again
            self.kick_socks[(ing.upstream, ing.up_ifname)].send(self.kick_frame)
        ing.paused = False
        self.counters[(ing.upstream, ing.up_ifname)].paused_s += now - ing.paused_since

    def _manual_requests(self, now: float) -> None:
        with self._lock:
            todo, self._manual = self._manual, []
        for switch, ifname, on in todo:
            ing = self.by_port[(switch, ifname)]
            if on and not ing.paused:
                self._xoff(ing, now, None)
                ing.watchdog_until = 0.0
            elif not on and ing.paused:
                self._release(ing, now, frame=True)
            if on:     # a forced pause stays until pause(..., on=False)
                ing.thresholds = Thresholds(0, -1, ing.thresholds.headroom_bytes,
                                            ing.thresholds.ok, "forced")
            else:
                ing.thresholds = self._orig_thresholds(ing)

    def _orig_thresholds(self, ing: Ingress) -> Thresholds:
        g = self.fab.topo.graph
        edge = g.edges[ing.switch, ing.upstream]
        return thresholds_for(ing.queue_bytes, max(1, len(self.fab.plan.ports[ing.switch]) - 1),
                              ing.rate_mbps, self.calibration["reaction_ms_assumed"] / 1e3,
                              length_m=edge.get("length_m", 0.0),
                              xoff_bytes=self.cfg.xoff_bytes, xon_bytes=self.cfg.xon_bytes,
                              headroom=self.cfg.headroom_bytes)

    def _sample(self, stats: dict, now: float) -> None:
        t = round(now - self.t0, 4)
        held = {(i.upstream, i.up_ifname): i for i in self.ingress if i.paused}
        for node, ports in self.fab.plan.ports.items():
            st = stats.get(node)
            if st is None:
                continue
            idx = self._index_of(node)
            for port in ports:
                got = st.get(idx.get(port.ifname, -1))
                if got is None:
                    continue
                c = self.counters[(node, port.ifname)]
                backlog, drops, _ = got
                if c.drops_at_start is None:
                    c.drops_at_start = drops
                c.drops = drops - c.drops_at_start
                c.backlog_bytes = backlog
                c.max_backlog_bytes = max(c.max_backlog_bytes, backlog)
                ing = held.get((node, port.ifname))
                paused_s = c.paused_s + (now - ing.paused_since if ing else 0.0)
                self.timeline.append({
                    "t_s": t, "node": node, "ifname": port.ifname, "backlog_bytes": backlog,
                    "drops": c.drops, "paused": int(ing is not None),
                    "paused_s": round(paused_s, 4), "frames_sent": c.frames_sent,
                    "frames_received": c.frames_received})

    def _index_of(self, node: str) -> dict[str, int]:
        cache = self.__dict__.setdefault("_idx_cache", {})
        if node not in cache:
            m = {i.ifname: i.index for i in self.ingress if i.switch == node}
            m.update({i.up_ifname: i.up_index for i in self.ingress if i.upstream == node})
            cache[node] = m
        return cache[node]

    # -- results -------------------------------------------------------------------------
    def report(self) -> dict:
        """What ran and what happened (JSON-ready; the timeline is `self.timeline`)."""
        def summary(values: list[float]) -> dict:
            if not values:
                return {"count": 0}
            s = sorted(values)
            return {"count": len(s), "mean": round(statistics.fmean(s), 3),
                    "p50": round(s[len(s) // 2], 3),
                    "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 3),
                    "max": round(s[-1], 3)}
        reaction = summary([r.reaction_ms for r in self.reactions])
        worst_ok = [i for i in self.ingress if not i.thresholds.ok]
        assumed = self.calibration.get("reaction_ms_assumed", 0.0)
        covers = reaction.get("max", 0.0) <= assumed if reaction["count"] else None
        ports = {f"{n}:{i}": {k: (round(v, 4) if isinstance(v, float) else v)
                              for k, v in asdict(c).items() if k != "drops_at_start"}
                 for (n, i), c in self.counters.items()}
        return {
            "enabled": self.cfg.enabled, "config": asdict(self.cfg),
            "calibration": self.calibration,
            "thresholds": {f"{i.switch}:{i.ifname}": asdict(i.thresholds)
                           for i in self.ingress},
            "headroom_ok": not worst_ok,
            "headroom_notes": sorted({f"{i.switch}: {i.thresholds.note}" for i in worst_ok}),
            "reaction_ms": reaction,
            "reaction_upper_ms": summary([r.upper_ms for r in self.reactions]),
            "frame_ms": summary([r.frame_ms for r in self.reactions]),
            "headroom_covers_measured_reaction": covers,
            "ports": ports,
            "totals": {"frames_sent": sum(c.frames_sent for c in self.counters.values()),
                       "xoff_frames": sum(c.xoff_frames for c in self.counters.values()),
                       "drops": sum(c.drops for c in self.counters.values()),
                       "paused_s": round(sum(c.paused_s for c in self.counters.values()), 4)},
            "storms": self.storms,
            "controller": {"cpu_s": round(self.cpu_s, 3), "wall_s": round(self.wall_s, 3),
                           "cpu_percent_of_core": round(100 * self.cpu_s / self.wall_s, 1)
                           if self.wall_s else 0.0,
                           "polls": self.polls, "late_polls": self.late_polls,
                           "max_poll_gap_ms": round(self.max_gap_s * 1e3, 3),
                           "late_poll_gaps": self.gaps,
                           "switches": len(self.switches)},
            "errors": self.errors,
        }


@contextlib.contextmanager
def pfc_running(fab, config: PfcConfig | None = None, install_layout: bool = True):
    """Install the lossless layout, run the controller for the block, stop it."""
    config = config or PfcConfig()
    if install_layout:
        install(fab, config.dscp)
    ctl = PfcController(fab, config).start()
    try:
        yield ctl
    finally:
        ctl.stop()


# -- results folder -------------------------------------------------------------------
TIMELINE_FIELDS = ["t_s", "node", "ifname", "backlog_bytes", "drops", "paused", "paused_s",
                   "frames_sent", "frames_received"]


def write_results(ctl: PfcController, folder: str | Path) -> dict:
    """pfc.json, pfc_timeline.csv and plots/pfc_*.png in `folder`; returns the report."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rep = ctl.report()
    (folder / "pfc.json").write_text(json.dumps(rep, indent=1) + "\n")
    with open(folder / "pfc_timeline.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=TIMELINE_FIELDS)
        w.writeheader()
        w.writerows(ctl.timeline)
    plot(ctl.timeline, folder / "plots")
    return rep


def plot(timeline: list[dict], folder: Path) -> list[Path]:
    """Queue occupancy, paused time, pause frames and drops per port against time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder.mkdir(parents=True, exist_ok=True)
    series: dict[str, list[dict]] = {}
    for row in timeline:
        series.setdefault(f"{row['node']}:{row['ifname']}", []).append(row)
    panels = [("backlog_bytes", "lossless queue (KiB)", 1 / 1024),
              ("paused_s", "paused time (s, cumulative)", 1.0),
              ("frames_sent", "PFC frames sent", 1.0),
              ("drops", "lossless drops", 1.0)]
    paths = []
    for key, label, scale in panels:
        active = {k: v for k, v in series.items() if any(r[key] for r in v)}
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, rows in sorted(active.items())[:12]:
            ax.plot([r["t_s"] for r in rows], [r[key] * scale for r in rows], label=name)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(label)
        ax.set_title(f"PFC: {label} per port" + ("" if active else " (none)"))
        if active:
            ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        path = folder / f"pfc_{key}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


@dataclass
class PfcRunSettings:
    """What `testbed run --pfc on|off --pfc-xoff ... ` passes (see run_with_pfc)."""

    mode: str = "off"             # "on" | "off" | "none" (no lossless layout at all)
    xoff_bytes: int | None = None
    xon_bytes: int | None = None
    headroom_bytes: int | None = None
    watchdog_ms: float = 500.0
    watchdog_action: str = "report"
    poll_ms: float = 1.0
    extra: dict = field(default_factory=dict)

    def config(self) -> PfcConfig:
        if self.mode not in ("on", "off"):
            raise ValueError(f"pfc: must be 'on' or 'off', got {self.mode!r}")
        return PfcConfig(enabled=self.mode == "on", xoff_bytes=self.xoff_bytes,
                         xon_bytes=self.xon_bytes, headroom_bytes=self.headroom_bytes,
                         watchdog_ms=self.watchdog_ms, watchdog_action=self.watchdog_action,
                         poll_ms=self.poll_ms, **self.extra)
