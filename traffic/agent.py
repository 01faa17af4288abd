"""Endpoint agent: one process per endpoint, run inside its namespace, runs its steps.

    python -m traffic.agent CONFIG.json      exit 0: ok; 1: failed (results say why)

    config ─▶ templates (scapy, once per peer/port/opcode) ─▶ event loop (select):
        UDP socket (loopback, 4791)  ── data ──▶ receiver state ──▶ ACK / NAK / SACK out
                                     ── ACKs ──▶ sender state (window, go-back-N / SACK)
        AF_PACKET socket per port    ◀── patched frames, flows interleaved round-robin
    ─▶ results JSON (flows, iterations, one-way latency samples, CPU seconds)

One-way latency (every `latency_sample_every`-th data packet of a flow) runs from the
sender's stamp in the payload to the kernel's receive timestamp of the datagram (taken
when the frame entered this namespace, read with SIOCGSTAMPNS), so neither the agent's
own scheduling nor its interrupt moderation (`coalesce_frames`) is counted as network time.

The hot path never calls scapy: a data packet is one template patch (PSN, UDP source
port, stamp, ICRC) and one send(2); a received datagram is one recv_into(2), one
struct unpack and one state-machine call. Send sockets are non-blocking: a full socket
buffer (EAGAIN) or a full port queue (ENOBUFS) keeps the frame and waits (select for
writability; a short retry for ENOBUFS), so no frame is dropped at the sender.

Steps: a step's sends start when every receive of the rank's previous step has
completed. Step 0 of iteration i+1 also waits for iteration i to be done at this rank
(its receives complete and its sends acknowledged), so iterations never overlap, even
for ranks that only send. Data arriving for a later step or iteration is accounted at
once (receivers are keyed by message id). Message ids on the wire are
`msg_id + iteration * 2**20`; ACKs carry their low 24 bits in the AETH MSN.

Once everything is done the agent lingers (`linger_ms`, extended while data still
arrives) to re-ACK resends whose ACK was lost, then writes its results and exits.
With `start_from_stdin`, it prints "ready" once its sockets and templates exist and
waits for a line "go <start_at_ns>" on stdin (see traffic.launch).
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import resource
import select
import signal
import socket
import struct
import sys
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from traffic.packets import (
    BTH_BYTES,
    DEFAULT_DSCP,
    DEFAULT_PRIORITY,
    ETH_BYTES,
    ICRC_BYTES,
    IPV4_BYTES,
    PSN_MASK,
    ROCE_UDP_PORT,
    SPORT_MIN,
    UDP_BYTES,
    UET_QPN_FLAG,
    Addresses,
    Opcode,
    Patcher,
    Syndrome,
    Template,
    now_ns,
)
from traffic.transport import (
    COALESCE_FRAMES,
    ENTROPY_MODES,
    NO_ACTION,
    STAMP_BYTES,
    TRANSPORTS,
    Entropy,
    TransportParams,
    make_receiver,
    make_sender,
    packet_bytes,
    packet_count,
)

ITERATION_MSG_STRIDE = 1 << 20      # wire message id = msg_id + iteration * 2**20
MSN_MASK = 0xFFFFFF
OFFSET_MASK = 0xFFFFFFFF            # the stamp's byte offset is 32 bits (wraps at 4 GiB)
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33   # <asm-generic/socket.h>
FRAME_OVERHEAD_BYTES = ETH_BYTES + IPV4_BYTES + UDP_BYTES + BTH_BYTES + ICRC_BYTES
SIOCGSTAMPNS = 0x8907               # <asm-generic/sockios.h>: receive time of the last datagram
TIMESPEC = struct.Struct("=qq")
RCVBUF_BYTES = 16 << 20
RX_BATCH = 256                      # datagrams per drain before sending again
PUMP_BATCH = 64                     # data frames per pump before receiving again
TIMER_MAX_NS = 5_000_000            # RTO checks at least this often
ENOBUFS_RETRY_NS = 200_000          # a full port queue: retry after 0.2 ms
LINK_DOWN_ERRNOS = (errno.ENETDOWN, errno.ENXIO)   # sending on a port whose link is down
WARMUP_PORTS = 64                   # ARP warm-up probes per peer and port (see _warm_up)
DATA_MIN = BTH_BYTES + STAMP_BYTES + ICRC_BYTES
ACK_BYTES, SACK_ACK_BYTES = 20, 32
OP_ACK = int(Opcode.RC_ACK)
DATA_HEAD = struct.Struct(">xB6xIQII")    # flags, PSN word, stamp (ts_ns, msg_id, offset)
ACK_HEAD = struct.Struct(">8xII")         # PSN word, AETH
SACK_HEAD = struct.Struct(">8xIIIQ")      # PSN word, AETH, SACK base word, bitmap
REQUIRED = ("node", "loopback", "transport", "entropy", "payload_bytes", "ports", "routes",
            "peers", "steps", "results_path")


class TerminatedError(BaseException):
    """SIGTERM or SIGINT arrived."""


class ConfigError(ValueError):
    pass


# -- configuration ----------------------------------------------------------------------
@dataclass
class AgentOptions:
    """Every knob of an agent, that neither the fabric nor the schedule decides."""

    transport: str = "roce"
    entropy: str = "ecmp"
    flowlet_gap_us: float = 200.0
    seed: int = 1
    payload_bytes: int = 4096
    dscp: int = DEFAULT_DSCP
    priority: int = DEFAULT_PRIORITY
    window_packets: int = 64
    ack_every: int = 8
    rto_ms: float = 50.0
    reorder_threshold: int = 32
    ack_delay_us: float = 1000.0
    timeout_s: float = 60.0
    iterations: int = 1
    latency_sample_every: int = 16
    linger_ms: float | None = None          # default: max(4 x rto_ms, 200)
    sndbuf_bytes: int | None = None         # default: the kernel's
    # Interrupt moderation: at most one wake-up per this many frame times of the agent's
    # fastest port (ports' rate_mbps; none given: no moderation). See `coalesce_ns`.
    coalesce_frames: float = COALESCE_FRAMES


@dataclass(kw_only=True)
class AgentConfig(AgentOptions):
    """What one agent reads: the options, plus its node, ports, routes and steps."""

    node: str
    loopback: str
    ports: dict[str, dict]          # ifname -> src_mac, dst_mac (, rate_mbps)
    routes: dict[str, list[str]]
    peers: dict[str, str]
    steps: list[dict]
    results_path: str
    start_at_ns: int = 0
    start_from_stdin: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> AgentConfig:
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ConfigError(f"config: missing {', '.join(missing)}")
        known = set(cls.__dataclass_fields__) - {"extra"}
        cfg = cls(**{k: v for k, v in data.items() if k in known},
                  extra={k: v for k, v in data.items() if k not in known})
        if cfg.transport not in TRANSPORTS:
            raise ConfigError(f"transport: {cfg.transport!r} is not one of {TRANSPORTS}")
        if cfg.entropy not in ENTROPY_MODES:
            raise ConfigError(f"entropy: {cfg.entropy!r} is not one of {ENTROPY_MODES}")
        if cfg.iterations < 1 or cfg.latency_sample_every < 1 or cfg.timeout_s <= 0:
            raise ConfigError("iterations, latency_sample_every and timeout_s must be positive")
        if cfg.payload_bytes < STAMP_BYTES:
            raise ConfigError(f"payload_bytes must be at least {STAMP_BYTES}")
        if cfg.coalesce_frames < 0:
            raise ConfigError(f"coalesce_frames must be >= 0, got {cfg.coalesce_frames}")
        for peer, ifnames in cfg.routes.items():
            if not ifnames or any(i not in cfg.ports for i in ifnames):
                raise ConfigError(f"routes[{peer}]: {ifnames} are not all in ports")
        for step in cfg.steps:
            for t in step.get("sends", []) + step.get("recvs", []):
                peer = t["dst"] if t["src"] == cfg.node else t["src"]
                if cfg.node not in (t["src"], t["dst"]):
                    raise ConfigError(f"transfer {t['tag']}: {cfg.node} is neither end")
                if peer not in cfg.routes or peer not in cfg.peers:
                    raise ConfigError(f"transfer {t['tag']}: no route or address for {peer}")
                if not 0 <= int(t["msg_id"]) < ITERATION_MSG_STRIDE:
                    raise ConfigError(f"transfer {t['tag']}: msg_id must be < 2**20")
        return cfg

    @property
    def params(self) -> TransportParams:
        return TransportParams(self.window_packets, self.ack_every, self.rto_ms,
                               self.reorder_threshold, self.ack_delay_us)

    @property
    def coalesce_ns(self) -> int:
        """Interrupt moderation, as a NIC does it: once awake, the agent handles what
        has queued, then sleeps until `coalesce_frames` frame times of its fastest port
        have passed since it woke (or a timer is due), so a wake-up (~15 us of CPU here)
        serves a few frames instead of one. The fastest port, so that no port's socket
        buffer runs dry while the agent sleeps; 0 when a port's rate is unknown."""
        rates = [p.get("rate_mbps") for p in self.ports.values()]
        if not self.coalesce_frames or not rates or not all(rates):
            return 0
        frame_bits = (self.payload_bytes + FRAME_OVERHEAD_BYTES) * 8
        return int(self.coalesce_frames * frame_bits / max(rates) * 1000)


def qpn(src: str, dst: str, transport: str) -> int:
    """The destination QP of the pair's flows (bit 23 marks a UET-style flow)."""
    q = (zlib.crc32(f"{src}>{dst}".encode()) & 0x7FFFFF) | 0x10
    return q | UET_QPN_FLAG if transport == "uet" else q


# -- ports ------------------------------------------------------------------------------
class Port:
    """A non-blocking AF_PACKET socket on one egress port; holds what it could not send."""

    __slots__ = ("ifname", "sock", "send", "pending", "blocked", "retry_ns", "frames",
                 "eagain", "enobufs", "down_drops", "ns_per_byte", "free_at")

    def __init__(self, ifname: str, priority: int | None, sndbuf_bytes: int | None,
                 rate_mbps: float | None = None):
        self.ifname = ifname
        self.ns_per_byte = 8000 / rate_mbps if rate_mbps else 0.0   # see `drained_at`
        self.free_at = 0
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            if priority is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)
            if sndbuf_bytes:
                sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sndbuf_bytes)
            sock.bind((ifname, 0))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.send = sock.send
        self.pending: deque[bytes] = deque()
        self.blocked = False
        self.retry_ns = 0
        self.frames = self.eagain = self.enobufs = self.down_drops = 0

    def push(self, frame: bytearray, now: int) -> None:
        """Send a frame, or keep a copy to send when the socket has room again."""
        if self.pending:
            self.pending.append(bytes(frame))
            return
        try:
            self.send(frame)
            self.frames += 1
        except BlockingIOError:
            self.pending.append(bytes(frame))
            self.blocked = True
            self.eagain += 1
        except OSError as exc:
            if exc.errno in LINK_DOWN_ERRNOS:  # the port is down: the frame is lost, as
                self.down_drops += 1           # on a NIC whose link failed; recovery is
                return                         # the transport's job
            if exc.errno != errno.ENOBUFS:
                raise
            self.pending.append(bytes(frame))
            self.blocked = True
            self.enobufs += 1
            self.retry_ns = now + ENOBUFS_RETRY_NS

    def drained_at(self, nbytes: int, now: int) -> int:
        """When this port will have sent what it was given, `nbytes` just now included:
        an estimate at the port's rate (for flowlet gaps: data frames only, ACKs are
        small; a port held by PFC or slowed by a lane failure drains later)."""
        start = now if now > self.free_at else self.free_at
        self.free_at = start + int(nbytes * self.ns_per_byte)
        return self.free_at

    def flush(self, now: int) -> bool:
        """Send what is held; True when nothing is left."""
        pending, send = self.pending, self.send
        self.retry_ns = 0
        while pending:
            try:
                send(pending[0])
            except BlockingIOError:
                self.blocked = True
                self.eagain += 1
                return False
            except OSError as exc:
                if exc.errno in LINK_DOWN_ERRNOS:
                    pending.popleft()
                    self.down_drops += 1
                    continue
                if exc.errno != errno.ENOBUFS:
                    raise
                self.blocked = True
                self.enobufs += 1
                self.retry_ns = now + ENOBUFS_RETRY_NS
                return False
            pending.popleft()
            self.frames += 1
        self.blocked = False
        return True

    def close(self) -> None:
        self.sock.close()


# -- flows ------------------------------------------------------------------------------
@dataclass(eq=False)
class Flow:
    tag: str
    src: str
    dst: str
    size_bytes: int
    iteration: int
    msg: int                 # message id on the wire
    role: str
    start_ns: int | None = None
    end_ns: int | None = None

    @property
    def msn(self) -> int:
        return self.msg & MSN_MASK


@dataclass(eq=False)
class SendFlow(Flow):
    tx: object = None
    entropy: Entropy | None = None
    ports: list[Port] = field(default_factory=list)
    slots: list[tuple] = field(default_factory=list)   # per port: 4 x (buf, patch)
    npackets: int = 0


@dataclass(eq=False)
class RecvFlow(Flow):
    rx: object = None
    entropy: Entropy | None = None
    ports: list[Port] = field(default_factory=list)
    acks: list[Patcher] = field(default_factory=list)   # per port: Template.ack_patcher
    npackets: int = 0
    last_wire: int = 0       # wire payload of the last packet (at least the stamp)
    samples: int = 0
    last_ns: int = 0         # last data arrival (the delayed-ACK timer runs from it)


@dataclass(eq=False)
class StepState:
    iteration: int
    index: int
    sends: list[SendFlow]
    recvs: list[RecvFlow]


# -- the agent --------------------------------------------------------------------------
class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.params = cfg.params
        self.ports: dict[str, Port] = {}
        self.rx: socket.socket | None = None
        self._templates: dict[tuple, tuple[bytearray, object]] = {}
        self._ack_templates: dict[tuple, tuple[Template, bytearray]] = {}
        self.steps: list[StepState] = []
        self.sends: list[SendFlow] = []
        self.recvs: list[RecvFlow] = []
        self.recv_by_msg: dict[int, RecvFlow] = {}
        self.send_by_msn: dict[int, SendFlow] = {}
        self.active: list[SendFlow] = []
        self.receiving: list[RecvFlow] = []      # started, not complete
        self.next_step = 0
        self.iter_start: list[int | None] = [None] * cfg.iterations
        self.iter_end: list[int | None] = [None] * cfg.iterations
        self.iter_left = [0] * cfg.iterations
        self.latency: list[list] = []
        self.unknown_packets = 0
        self.bad_packets = 0
        self.done_ns: int | None = None
        self.udp_before: dict[str, int] = {}
        self.started_ns = 0
        self.cpu_start_s: float | None = None
        self.wakeups = 0
        self.warmup_frames = 0
        self.realtime_offset_ns = 0     # CLOCK_REALTIME - CLOCK_MONOTONIC
        self.kernel_stamps = True       # latency from kernel receive timestamps

    # -- setup -------------------------------------------------------------------------
    def open(self) -> None:
        cfg = self.cfg
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
        rx.bind((cfg.loopback, ROCE_UDP_PORT))
        rx.setblocking(False)
        self.rx = rx
        self._enable_rx_stamps()
        used = {i for ifnames in cfg.routes.values() for i in ifnames}
        for ifname in sorted(used):
            self.ports[ifname] = Port(ifname, cfg.priority, cfg.sndbuf_bytes,
                                      cfg.ports[ifname].get("rate_mbps"))
        self.udp_before = udp_counters()
        self._plan()
        self._warm_up()

    def _enable_rx_stamps(self) -> None:
        """The first SIOCGSTAMPNS turns on receive timestamps for the socket (and answers
        ENOENT: nothing read yet); later ones give the last datagram's, in CLOCK_REALTIME."""
        try:
            fcntl.ioctl(self.rx.fileno(), SIOCGSTAMPNS, bytes(TIMESPEC.size))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self.kernel_stamps = False
        self.realtime_offset_ns = realtime_offset_ns()

    def _arrival_ns(self) -> int:
        """When the datagram just read reached this namespace (CLOCK_MONOTONIC)."""
        if self.kernel_stamps:
            try:
                sec, nsec = TIMESPEC.unpack(fcntl.ioctl(self._rx_fd, SIOCGSTAMPNS,
                                                        bytes(TIMESPEC.size)))
                return sec * 1_000_000_000 + nsec - self.realtime_offset_ns
            except OSError:
                self.kernel_stamps = False
        return now_ns()

    def close(self) -> None:
        for port in self.ports.values():
            port.close()
        if self.rx is not None:
            self.rx.close()

    def _plan(self) -> None:
        cfg = self.cfg
        for it in range(cfg.iterations):
            for k, step in enumerate(cfg.steps):
                sends = [self._send_flow(t, it) for t in step.get("sends", [])]
                recvs = [self._recv_flow(t, it) for t in step.get("recvs", [])]
                self.steps.append(StepState(it, k, sends, recvs))
                self.iter_left[it] += len(sends) + len(recvs)

    def _warm_up(self) -> None:
        """Send WARMUP_PORTS small probes per peer and egress port, each with another
        UDP source port, so every router on every ECMP path resolves its next hop's
        address (ARP) before the run: the first data packets would otherwise wait in
        the neighbour queue, which holds only a few 4 KiB frames, and be dropped.

        A probe is an ACK with an RNR NAK syndrome for no message (MSN 0xFFFFFF), which
        both senders ignore; agents that are not listening yet answer nothing."""
        now = now_ns()
        for peer, ifnames in self.cfg.routes.items():
            for ifname in ifnames:
                template, _ = self._ack_template(peer, ifname)
                buf = template.buffer()
                for i in range(WARMUP_PORTS):
                    template.patch_ack(buf, 0, SPORT_MIN + i * (0x4000 // WARMUP_PORTS),
                                       Syndrome.RNR_NAK, MSN_MASK)
                    self.ports[ifname].push(buf, now)
        self.warmup_frames = sum(p.frames + len(p.pending) for p in self.ports.values())

    def _flow_ports(self, peer: str) -> list[Port]:
        return [self.ports[i] for i in self.cfg.routes[peer]]

    def _send_flow(self, t: dict, it: int) -> SendFlow:
        cfg = self.cfg
        if t["src"] != cfg.node:
            raise ConfigError(f"send {t['tag']}: src is {t['src']}, not {cfg.node}")
        msg = int(t["msg_id"]) + it * ITERATION_MSG_STRIDE
        size = int(t["size_bytes"])
        n = packet_count(size, cfg.payload_bytes)
        f = SendFlow(t["tag"], t["src"], t["dst"], size, it, msg, "send",
                     entropy=Entropy(cfg.entropy, cfg.seed, f"{t['tag']}#{it}",
                                     cfg.flowlet_gap_us),
                     ports=self._flow_ports(t["dst"]), npackets=n)
        f.slots = [self._data_slots(t["dst"], port.ifname, size, n) for port in f.ports]
        self.sends.append(f)
        return f

    def _recv_flow(self, t: dict, it: int) -> RecvFlow:
        cfg = self.cfg
        if t["dst"] != cfg.node:
            raise ConfigError(f"recv {t['tag']}: dst is {t['dst']}, not {cfg.node}")
        msg = int(t["msg_id"]) + it * ITERATION_MSG_STRIDE
        size = int(t["size_bytes"])
        n = packet_count(size, cfg.payload_bytes)
        f = RecvFlow(t["tag"], t["src"], t["dst"], size, it, msg, "recv",
                     entropy=Entropy(cfg.entropy, cfg.seed, f"{t['tag']}#{it}#ack",
                                     cfg.flowlet_gap_us),
                     ports=self._flow_ports(t["src"]), npackets=n,
                     last_wire=max(STAMP_BYTES, packet_bytes(n - 1, size, cfg.payload_bytes)))
        f.acks = [t_.ack_patcher(buf) for t_, buf in
                  (self._ack_template(t["src"], port.ifname) for port in f.ports)]
        if msg in self.recv_by_msg:
            raise ConfigError(f"recv {t['tag']}: msg_id {t['msg_id']} is used twice")
        self.recv_by_msg[msg] = f
        self.recvs.append(f)
        return f

    def _addresses(self, peer: str, ifname: str) -> Addresses:
        port = self.cfg.ports[ifname]
        return Addresses(port["src_mac"], port["dst_mac"], self.cfg.loopback,
                         self.cfg.peers[peer])

    def _data_slots(self, dst: str, ifname: str, size: int, n: int) -> tuple:
        """(first, middle, middle with AckReq, last): (buf, patch) for each."""
        cfg = self.cfg
        full = cfg.payload_bytes
        last_wire = max(STAMP_BYTES, packet_bytes(n - 1, size, full))
        every = cfg.ack_every
        if n == 1:
            only = self._template(dst, ifname, Opcode.RC_SEND_ONLY, last_wire, True)
            return (only, only, only, only)
        first = self._template(dst, ifname, Opcode.RC_SEND_FIRST, full, every == 1)
        middle = self._template(dst, ifname, Opcode.RC_SEND_MIDDLE, full, every == 1)
        middle_ack = self._template(dst, ifname, Opcode.RC_SEND_MIDDLE, full, True)
        last = self._template(dst, ifname, Opcode.RC_SEND_LAST, last_wire, True)
        return (first, middle, middle_ack, last)

    def _template(self, dst: str, ifname: str, opcode: int, wire: int, ackreq: bool) -> tuple:
        key = (dst, ifname, int(opcode), wire, ackreq)
        got = self._templates.get(key)
        if got is None:
            cfg = self.cfg
            t = Template.build(opcode, self._addresses(dst, ifname),
                               dqpn=qpn(cfg.node, dst, cfg.transport), payload_bytes=wire,
                               dscp=cfg.dscp, ackreq=ackreq)
            buf = t.buffer()
            got = self._templates[key] = (buf, t.patcher(buf))
        return got

    def _ack_template(self, src: str, ifname: str) -> tuple[Template, bytearray]:
        key = (src, ifname)
        got = self._ack_templates.get(key)
        if got is None:
            cfg = self.cfg
            t = Template.build(Opcode.RC_ACK, self._addresses(src, ifname),
                               dqpn=qpn(src, cfg.node, cfg.transport), dscp=cfg.dscp,
                               sack=cfg.transport == "uet")
            got = self._ack_templates[key] = (t, t.buffer())
        return got

    # -- progress ----------------------------------------------------------------------
    def _advance(self, now: int) -> None:
        """Start every step whose gate is open."""
        steps = self.steps
        while self.next_step < len(steps):
            k = self.next_step
            st = steps[k]
            if k > 0:
                prev = steps[k - 1]
                if any(r.end_ns is None for r in prev.recvs):
                    return
                if st.index == 0 and self.iter_end[prev.iteration] is None:
                    return
            if st.index == 0:
                self.iter_start[st.iteration] = now
                if self.iter_left[st.iteration] == 0:
                    self._iteration_done(st.iteration, now)
            for f in st.sends:
                f.tx = make_sender(self.cfg.transport, f.npackets, self.params)
                f.start_ns = now
                self.send_by_msn[f.msn] = f
                self.active.append(f)
            self.next_step = k + 1

    def _flow_done(self, f: Flow, now: int) -> None:
        f.end_ns = now
        it = f.iteration
        self.iter_left[it] -= 1
        if self.iter_left[it] == 0 and self.iter_start[it] is not None:
            self._iteration_done(it, now)
        self._advance(now)

    def _iteration_done(self, it: int, now: int) -> None:
        self.iter_end[it] = now
        if all(e is not None for e in self.iter_end):
            self.done_ns = now

    # -- the hot paths -----------------------------------------------------------------
    def _drain_rx(self) -> bool:
        """Handle queued datagrams (up to RX_BATCH); True if any data arrived."""
        recv_into, rbuf = self._recv_into, self._rbuf
        recv_by_msg, send_by_msn = self.recv_by_msg, self.send_by_msn
        unpack_data, unpack_ack, unpack_sack = (DATA_HEAD.unpack_from, ACK_HEAD.unpack_from,
                                                SACK_HEAD.unpack_from)
        clock = now_ns
        now = clock()
        payload = self.cfg.payload_bytes
        sample_every = self.cfg.latency_sample_every
        got_data = False
        for _ in range(RX_BATCH):
            try:
                n = recv_into(rbuf)
            except BlockingIOError:
                break
            op = rbuf[0]
            if op == OP_ACK:
                if n >= SACK_ACK_BYTES:
                    psnw, aeth, basew, bitmap = unpack_sack(rbuf)
                elif n >= ACK_BYTES:
                    psnw, aeth = unpack_ack(rbuf)
                    basew = bitmap = 0
                else:
                    self.bad_packets += 1
                    continue
                f = send_by_msn.get(aeth & MSN_MASK)
                if f is None or f.end_ns is not None:
                    continue
                tx = f.tx
                tx.on_ack(now, aeth >> 24, psnw & PSN_MASK, basew & PSN_MASK, bitmap)
                if tx.done:
                    self.active.remove(f)
                    self._flow_done(f, clock())
                continue
            if n < DATA_MIN:
                self.bad_packets += 1
                continue
            flags, psnw, ts, msg, offset = unpack_data(rbuf)
            f = recv_by_msg.get(msg)
            if f is None:
                self.unknown_packets += 1
                continue
            got_data = True
            psn = psnw & PSN_MASK
            wire = n - BTH_BYTES - ICRC_BYTES - ((flags >> 4) & 3)
            if offset != (psn * payload) & OFFSET_MASK or wire != (
                    f.last_wire if psn == f.npackets - 1 else payload):
                self.bad_packets += 1
                continue
            rx = f.rx
            if rx is None:
                rx = f.rx = make_receiver(self.cfg.transport, f.size_bytes, payload,
                                          self.params)
                f.start_ns = now
                self.receiving.append(f)
            f.last_ns = now
            action = rx.on_data(psn, psnw >> 31, ts)
            f.samples += 1
            if f.samples % sample_every == 0:
                self.latency.append([f.tag, f.iteration, self._arrival_ns() - ts])
            if action != NO_ACTION:
                self._send_ack(f, rx, action, now)
            if rx.complete and f.end_ns is None:
                self._flow_done(f, clock())
        return got_data

    def _send_ack(self, f: RecvFlow, rx, action: int, now: int) -> None:
        syndrome, psn, base, bitmap = rx.ack_fields(action)
        sport = f.entropy.port(now)
        k = sport % len(f.ports) if len(f.ports) > 1 else 0
        patch = f.acks[k]
        patch(psn & PSN_MASK, sport, syndrome, f.msn, base, bitmap)
        f.ports[k].push(patch.buf, now)

    def _pump(self, now: int) -> bool:
        """Send data, one packet per active flow per round; True if the budget ran out."""
        active = self.active
        if not active:
            return False
        clock = now_ns
        payload = self.cfg.payload_bytes
        every = self.cfg.ack_every
        budget = PUMP_BATCH
        while True:
            sent = 0
            for f in active:
                ports = f.ports
                if ports[0].blocked or (len(ports) > 1 and any(p.blocked for p in ports)):
                    continue
                psn = f.tx.take(now)
                if psn < 0:
                    continue
                ent = f.entropy
                sport = ent.fixed if ent.fixed is not None else ent.port(clock())
                k = sport % len(ports) if len(ports) > 1 else 0
                slots = f.slots[k]
                if psn == 0:
                    buf, patch = slots[0]
                elif psn == f.npackets - 1:
                    buf, patch = slots[3]
                elif (psn + 1) % every == 0:
                    buf, patch = slots[2]
                else:
                    buf, patch = slots[1]
                patch(psn, sport, clock(), f.msg, (psn * payload) & OFFSET_MASK)
                ports[k].push(buf, now)
                if ent.flowlet:
                    ent.on_wire_until(ports[k].drained_at(len(buf), now))
                sent += 1
            budget -= sent
            if not sent:
                return False
            if budget <= 0:
                return True

    def _timers(self, now: int) -> int:
        """Fire due retransmission and delayed-ACK timers; return when to look again."""
        nxt = now + TIMER_MAX_NS
        for f in self.active:
            f.tx.on_timer(now)
            d = f.tx.deadline_ns()
            if d is not None and d < nxt:
                nxt = d
        delay = self.params.ack_delay_ns
        if any(f.rx.complete for f in self.receiving):
            self.receiving = [f for f in self.receiving if not f.rx.complete]
        for f in self.receiving:
            rx = f.rx
            if rx.since_ack:
                due = f.last_ns + delay
                if now >= due:
                    self._send_ack(f, rx, rx.delayed_ack(), now)
                elif due < nxt:
                    nxt = due
        return nxt

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> None:
        cfg = self.cfg
        self._rbuf = bytearray(65536)
        self._recv_into = self.rx.recv_into
        self._rx_fd = self.rx.fileno()
        now = now_ns()
        if cfg.start_at_ns > now:
            time.sleep((cfg.start_at_ns - now) / 1e9)
        self.started_ns = now = now_ns()
        self.cpu_start_s = cpu_seconds()
        deadline = now + int(cfg.timeout_s * 1e9)
        linger_ns = int((cfg.linger_ms if cfg.linger_ms is not None
                         else max(4 * cfg.rto_ms, 200.0)) * 1e6)
        coalesce_ns = cfg.coalesce_ns
        linger_until = None
        self._advance(now)
        timer_ns = now
        rx_fd = self.rx
        ports = list(self.ports.values())
        sel = select.select
        clock = now_ns
        woke = now
        while True:
            got = self._drain_rx()
            now = clock()
            if self.done_ns is not None:
                if linger_until is None or got:
                    linger_until = max(linger_until or 0, now + linger_ns)
                if now >= linger_until and not any(p.pending for p in ports):
                    return
            if now >= deadline:
                raise TimeoutError(self._missing(cfg.timeout_s))
            if now >= timer_ns:
                timer_ns = self._timers(now)
            retry = [p for p in ports if p.retry_ns]
            for p in retry:
                if now >= p.retry_ns:
                    p.flush(now)
            if self._pump(now):
                timeout = 0.0     # the send budget ran out: receive, then send more
            else:
                wake = min(timer_ns, deadline, linger_until or deadline)
                for p in retry:
                    if p.retry_ns and p.retry_ns < wake:
                        wake = p.retry_ns
                if coalesce_ns and woke + coalesce_ns > now:
                    # Interrupt moderation: at most one wake-up per coalesce_ns, so
                    # packets are handled in batches (a wake-up costs ~10-20 us of CPU).
                    nap = min(woke + coalesce_ns, wake) - now
                    if nap > 0:
                        time.sleep(nap / 1e9)
                        now = clock()
                timeout = max(0.0, (wake - now) / 1e9)
            wlist = [p.sock for p in ports if p.blocked and not p.retry_ns]
            _, writable, _ = sel([rx_fd], wlist, [], timeout)
            woke = clock()
            self.wakeups += 1
            if writable:
                for p in ports:
                    if p.sock in writable:
                        p.flush(woke)

    def _missing(self, after_s: float) -> str:
        parts = []
        for f in self.recvs:
            if f.end_ns is None:
                got = f.rx.delivered_packets if f.rx is not None else 0
                parts.append(f"recv {f.tag} (iteration {f.iteration}): "
                             f"{got}/{f.npackets} packets")
        for f in self.sends:
            if f.end_ns is None:
                if f.tx is None:
                    parts.append(f"send {f.tag} (iteration {f.iteration}): not started")
                else:
                    parts.append(f"send {f.tag} (iteration {f.iteration}): "
                                 f"{f.tx.una}/{f.npackets} packets acknowledged")
        shown = "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else "")
        return f"{shown} after {after_s:g} s" if parts else f"not finished after {after_s:g} s"

    # -- results -----------------------------------------------------------------------
    def results(self, error: str | None) -> dict:
        cfg = self.cfg
        flows = []
        for f in self.sends:
            tx = f.tx
            flows.append({
                "tag": f.tag, "iteration": f.iteration, "src": f.src, "dst": f.dst,
                "size_bytes": f.size_bytes, "role": "send", "start_ns": f.start_ns,
                "end_ns": f.end_ns, "npackets": f.npackets,
                "packets": tx.packets if tx else 0,
                "retransmits": tx.retransmits if tx else 0, "naks": tx.naks if tx else 0,
                "timeouts": tx.timeouts if tx else 0, "acks": tx.acks if tx else 0,
                "ooo_packets": 0, "dup_packets": 0, "max_reorder": 0,
                "bytes_delivered": (f.size_bytes if f.end_ns is not None else 0),
                "exactly_once": None, "flowlet_changes": f.entropy.changes})
        for f in self.recvs:
            rx = f.rx
            flows.append({
                "tag": f.tag, "iteration": f.iteration, "src": f.src, "dst": f.dst,
                "size_bytes": f.size_bytes, "role": "recv", "start_ns": f.start_ns,
                "end_ns": f.end_ns, "npackets": f.npackets,
                "packets": rx.packets if rx else 0, "retransmits": 0,
                "naks": rx.naks if rx else 0, "timeouts": 0, "acks": rx.acks if rx else 0,
                "ooo_packets": rx.ooo_packets if rx else 0,
                "dup_packets": rx.dup_packets if rx else 0,
                "max_reorder": rx.max_reorder if rx else 0,
                "bytes_delivered": rx.bytes_delivered if rx else 0,
                "exactly_once": bool(rx and rx.exactly_once),
                "flowlet_changes": f.entropy.changes})     # of its ACKs
        udp_after = udp_counters()
        ports = {p.ifname: {"frames": p.frames, "eagain": p.eagain, "enobufs": p.enobufs,
                            "down_drops": p.down_drops,
                            "pending": len(p.pending)} for p in self.ports.values()}
        cpu = cpu_seconds()
        return {
            "node": cfg.node, "ok": error is None, "error": error,
            "transport": cfg.transport, "entropy": cfg.entropy,
            "iterations": [{"start_ns": s, "end_ns": e}     # completed ones, in order
                           for s, e in zip(self.iter_start, self.iter_end, strict=True)
                           if e is not None],
            "iterations_started": sum(s is not None for s in self.iter_start),
            "flows": flows,
            "latency_ns": self.latency,
            "cpu_s": cpu,
            "cpu_run_s": None if self.cpu_start_s is None else cpu - self.cpu_start_s,
            "started_ns": self.started_ns or None,
            "start_late_ns": (max(0, self.started_ns - self.cfg.start_at_ns)
                              if self.started_ns and self.cfg.start_at_ns else None),
            "done_ns": self.done_ns,
            "ports": ports,
            "wakeups": self.wakeups,
            "coalesce_us": cfg.coalesce_ns / 1000,
            "latency_clock": "kernel receive timestamp" if self.kernel_stamps
                             else "agent read time",
            "warmup_frames": self.warmup_frames,
            "unknown_packets": self.unknown_packets,
            "bad_packets": self.bad_packets,
            "udp_rcvbuf_errors": (udp_after.get("RcvbufErrors", 0)
                                  - self.udp_before.get("RcvbufErrors", 0)),
        }


def realtime_offset_ns(tries: int = 5) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few bracketed reads."""
    best = None
    for _ in range(tries):
        before = now_ns()
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        after = now_ns()
        if best is None or after - before < best[0]:
            best = (after - before, real - (before + after) // 2)
    return best[1]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def empty_results(node: str | None, error: str, transport: str | None = None,
                  entropy: str | None = None) -> dict:
    """Results of an agent that did not get to run (same keys as Agent.results)."""
    return {"node": node, "ok": False, "error": error, "transport": transport,
            "entropy": entropy, "iterations": [], "iterations_started": 0, "flows": [],
            "latency_ns": [], "cpu_s": cpu_seconds(), "cpu_run_s": None}


def udp_counters() -> dict[str, int]:
    """The Udp: line of /proc/net/snmp, of the namespace this process is in."""
    try:
        lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines()
                 if ln.startswith("Udp:")]
        return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:], strict=True)}
    except (OSError, IndexError, ValueError):
        return {}


def write_json(path: str, data: dict) -> None:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(target)


def _terminate(signum, frame) -> None:
    raise TerminatedError()


def wait_for_go(stdin=None) -> int:
    """Print "ready", then read "go <start_at_ns>" (0: now); raise if stdin closes first."""
    stdin = stdin or sys.stdin
    print("ready", flush=True)
    line = stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        raise ConfigError(f"expected 'go <start_at_ns>' on stdin, got {' '.join(line)!r}")
    return int(line[1])


def run(config: dict) -> dict:
    """Run one agent in this process (and namespace); return its results."""
    cfg = AgentConfig.from_dict(config)
    agent = Agent(cfg)
    error = None
    try:
        agent.open()
        gc.collect()     # before "ready": a full collection takes tens of ms with scapy
        gc.freeze()      # loaded, 16 agents at once on 2 cores much more
        if cfg.start_from_stdin:
            cfg.start_at_ns = wait_for_go()
        agent.run()
    except TerminatedError:
        error = "terminated"
    except TimeoutError as exc:
        error = str(exc)
    except Exception as exc:  # reported in the results, not lost
        error = f"{type(exc).__name__}: {exc}"
    finally:
        agent.close()
    return agent.results(error)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m traffic.agent CONFIG.json", file=sys.stderr)
        return 2
    try:
        config = json.loads(Path(argv[0]).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"agent: cannot read {argv[0]}: {exc}", file=sys.stderr)
        return 1
    saved = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            results = run(config)
        except TerminatedError:
            results = empty_results(config.get("node"), "terminated",
                                    config.get("transport"), config.get("entropy"))
        except (ConfigError, ValueError, KeyError, TypeError) as exc:
            results = empty_results(config.get("node"), f"config: {exc}",
                                    config.get("transport"), config.get("entropy"))
        for sig in saved:                 # a late signal must not cut the results short
            signal.signal(sig, signal.SIG_IGN)
        if config.get("results_path"):
            write_json(config["results_path"], results)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if not results["ok"]:
        print(f"agent {config.get('node')}: {results['error']}", file=sys.stderr)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
