"""The switch controller's per-port state and the arithmetic on it (no kernel, no sockets).

fabric.switch_control polls the kernel and acts; what it decides from is here: each switch
ingress port (`Ingress`) with its upstream and thresholds, how the lossless backlog of
a switch is charged to its ingress ports, when the occupancy crossed XOFF, and the
counters of every port. Also the controller's own tuning knobs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fabric.lossless import (
    LOSSLESS_MTU_BYTES,
    SwitchSettings,
    Thresholds,
    hold_message,
    thresholds_for,
)
from fabric.wire import MAX_QUANTA, quanta_s
from topologies.stats import percentile

QdiscStats = tuple[int, int, int]      # backlog_bytes, drops, sent_bytes (fabric.qdisc_poller)
SHARE_EWMA = 0.3                       # weight of the newest rate in an upstream's share
# How late the SCHED_FIFO controller may come round on a loaded 2-core machine (softirq
# forwarding runs first). Measured in the leaf-spine incast at 0.5 ms polls (5 runs):
# poll gap p99 0.53-0.56 ms, the longest gap 1.0-3.8 ms, the slowest reaction 0.74-0.96
# ms against 0.55 ms of period + read + change.
WAKEUP_ALLOWANCE_MS = 1.0
# A poll's read of every switch and one tc change, before they are measured at start (a
# rate is planned before the fabric exists): 0.017 ms on 8 switches in the leaf-spine
# incast, so this covers fabrics several times that size.
READ_CHANGE_ALLOWANCE_MS = 0.1


def assumed_reaction_ms(poll_ms: float, read_change_ms: float = READ_CHANGE_ALLOWANCE_MS
                        ) -> float:
    """The reaction time the controller assumes (XOFF crossing to the upstream held): a
    full period, a full read and the change, x1.5, plus the wake-up allowance."""
    return 1.5 * (poll_ms + read_change_ms) + WAKEUP_ALLOWANCE_MS


@dataclass(frozen=True)
class ControllerTuning:
    """Knobs of the emulated switch logic (not user settings: fabric.lossless declares
    those, SwitchSettings)."""

    reaction_ms: float = 0.0       # assumed reaction time; 0: calibrated at start
    share_ms: float = 10.0         # how often upstream byte shares are updated
    quanta: int = MAX_QUANTA       # pause time of an XOFF frame
    sample_ms: float = 20.0        # timeline resolution
    rt_priority: int | None = 10   # SCHED_FIFO for the controller (None: no)
    own_process: bool = True       # False: a thread of the run's process (shares its GIL)
    kernel_counters: bool = True   # occupancy from eBPF counters where they load
    sleep: bool = True             # while nothing is queued, until the kernel wakes it

    def __post_init__(self) -> None:
        if not 0 < self.quanta <= MAX_QUANTA:
            raise ValueError(f"quanta must be 1..{MAX_QUANTA}, got {self.quanta}")
        if self.reaction_ms < 0 or self.share_ms <= 0 or self.sample_ms <= 0:
            raise ValueError(f"bad controller periods: {self}")


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
    peak_occupancy: float = 0.0    # the most ever charged to it (XOFF + what came after)
    paused: bool = False
    paused_since: float = 0.0
    feeds: frozenset[str] | None = None   # neighbours its traffic can leave toward
    last_frame: float = 0.0
    storm_reported: bool = False
    watchdog_until: float = 0.0
    # the upstream is on another machine (a fabric spread over several): the frame is all
    # this controller sends; that machine's fabric.pause_receiver holds the class on receipt
    remote: bool = False

    def update_weight(self, up_sent_bytes: int, dt_s: float | None) -> None:
        """Fold the upstream's lossless bytes sent since the last update into its share
        (frozen while paused: a held class says nothing about what it would send)."""
        if self.last_up_bytes is not None and dt_s and not self.paused:
            rate = (up_sent_bytes - self.last_up_bytes) / dt_s
            self.weight = rate if self.weight == 0 else \
                (1 - SHARE_EWMA) * self.weight + SHARE_EWMA * rate
        self.last_up_bytes = up_sent_bytes


def fan_in(topo, switch: str) -> int:
    """The ingress ports of `switch` that may fill one of its egress buffers: its others."""
    return max(1, topo.graph.degree(switch) - 1)


def ingress_thresholds(topo, switch: str, upstream: str, settings: SwitchSettings,
                       reaction_ms: float) -> Thresholds:
    """Thresholds of `switch`'s ingress from `upstream` in the topology spec `topo`, for
    its fan-in (fan_in) into one egress buffer."""
    edge = topo.graph.edges[switch, upstream]
    return thresholds_for(edge["queue_bytes"], fan_in(topo, switch),
                          edge["rate_mbps"], reaction_ms / 1e3, mtu=LOSSLESS_MTU_BYTES,
                          length_m=edge.get("length_m", 0.0), xoff_bytes=settings.pfc_xoff_bytes,
                          xon_bytes=settings.pfc_xon_bytes, headroom=settings.pfc_headroom_bytes)


def switch_ports(fab, switches: list[str], index: dict[str, dict[str, int]],
                 settings: SwitchSettings, tuning: ControllerTuning,
                 reaction_ms: float) -> list[Ingress]:
    """Every port of every switch as an ingress, with its upstream's hold and release
    messages encoded once (`index`: node -> ifname -> interface index, of this machine's
    nodes: an upstream not in it is on another machine, `remote`)."""
    out = []
    for s in switches:
        for port in fab.plan.ports[s]:
            edge = fab.topo.graph.edges[s, port.peer]
            rate_mbps, queue_bytes = edge["rate_mbps"], edge["queue_bytes"]
            remote = port.peer not in index          # on another machine
            up_index = -1 if remote else index[port.peer][port.peer_ifname]
            out.append(Ingress(
                s, port.ifname, index[s][port.ifname], port.peer, port.peer_ifname, up_index,
                rate_mbps, queue_bytes,
                ingress_thresholds(fab.topo, s, port.peer, settings, reaction_ms),
                quanta_s(tuning.quanta, rate_mbps),
                (b"", b"") if remote else tuple(hold_message(up_index, rate_mbps,
                                                             queue_bytes, held)
                                                for held in (False, True)),
                feeds=feeds(fab.routes, s, port.peer, fab.topo.endpoints()), remote=remote))
    return out


def feeds(routes, switch: str, upstream: str, endpoints) -> frozenset[str]:
    """The neighbours of `switch` toward which traffic arriving from `upstream` can
    leave: for some endpoint, `upstream` forwards to it via `switch` and `switch` on
    via that neighbour (`routes`: fabric.routing.Routes; lossless traffic goes from
    endpoint to endpoint, so switch loopbacks are no destinations here)."""
    ahead, behind = routes[switch], routes[upstream]
    out: set[str] = set()
    for dst in endpoints:
        if switch in behind.get(dst, ()):
            out.update(h for h in ahead.get(dst, ()) if h != upstream)
    return frozenset(out)


def charge_occupancy(ports: list[Ingress], backlogs: dict[int, int]) -> None:
    """Charge each egress port's lossless backlog to the ingress ports of the same switch
    whose traffic the routes can send out of it (`feeds`; all the others when unknown),
    in proportion to their upstreams' shares. Charging an ingress for a queue its
    traffic never enters would pause it for nothing, and with up-down routing such
    pauses made a cycle (leaf0 > spine1 > leaf1 > spine0 > leaf0) that stalled every
    flow: a PFC deadlock the routes themselves cannot form."""
    for p in ports:
        p.prev_occupancy, p.occupancy = p.occupancy, 0.0
    for e in ports:
        backlog = backlogs.get(e.index, 0)
        if not backlog:
            continue
        feeders = [i for i in ports if i is not e and i.weight > 0
                   and (i.feeds is None or e.upstream in i.feeds)]
        den = sum(i.weight for i in feeders)
        if den <= 0:
            continue
        for i in feeders:
            i.occupancy += backlog * i.weight / den


def crossing_time(ing: Ingress, t_prev: float, now: float) -> float:
    """When the occupancy crossed XOFF, interpolated between the last two polls."""
    occ0, occ1, xoff = ing.prev_occupancy, ing.occupancy, ing.thresholds.xoff_bytes
    frac = (xoff - occ0) / (occ1 - occ0) if occ1 > occ0 else 1.0
    return t_prev + min(1.0, max(0.0, frac)) * (now - t_prev)


@dataclass
class Reaction:
    switch: str
    ifname: str
    t_s: float
    reaction_ms: float            # estimated XOFF crossing -> hold applied upstream
    upper_ms: float               # last poll below XOFF -> hold applied upstream
    frame_ms: float               # crossing -> frame handed to the port's qdisc


@dataclass
class PortCounters:
    frames_sent: int = 0           # handed to the port's qdisc (and so seen by a capture)
    xoff_frames: int = 0
    xon_frames: int = 0
    frames_received: int = 0
    send_errors: int = 0           # frames the port's control queue refused
    paused_s: float = 0.0
    drops: int = 0
    drops_at_start: int | None = None
    max_backlog_bytes: int = 0
    backlog_bytes: int = 0
    sent_bytes: int = 0            # lossless bytes the port has sent (cumulative)

    def note_queue(self, backlog_bytes: int, drops: int, sent_bytes: int = 0) -> None:
        """A sample of the port's lossless queue (drops counted from the first sample)."""
        if self.drops_at_start is None:
            self.drops_at_start = drops
        self.drops = drops - self.drops_at_start
        self.backlog_bytes = backlog_bytes
        self.sent_bytes = sent_bytes
        self.max_backlog_bytes = max(self.max_backlog_bytes, backlog_bytes)

    def row(self, t_s: float, node: str, ifname: str, paused: bool, paused_s: float) -> dict:
        """One timeline row (fabric.switch_report.TIMELINE_FIELDS) for this port."""
        return {"t_s": t_s, "node": node, "ifname": ifname,
                "backlog_bytes": self.backlog_bytes, "sent_bytes": self.sent_bytes,
                "drops": self.drops, "paused": int(paused), "paused_s": round(paused_s, 4),
                "frames_sent": self.frames_sent, "frames_received": self.frames_received}


@dataclass
class PollClock:
    """How regularly the controller polled: a late poll is one more than 3 periods + 1 ms
    after the last (the machine did not run the controller in time)."""

    polls: int = 0
    late_polls: int = 0
    max_gap_s: float = 0.0
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (t_s, gap_ms), late
    last: float | None = None
    recent: deque = field(default_factory=lambda: deque(maxlen=20_000))   # gaps, s

    def gap_p99_ms(self) -> float | None:
        """The 99th percentile of the gaps between polls (the fidelity verdict's PFC lag)."""
        p99 = percentile(self.recent, 99)
        return None if p99 is None else p99 * 1e3

    def note(self, now: float, period_s: float, t0: float) -> None:
        self.polls += 1
        if self.last is not None:
            gap = now - self.last
            self.recent.append(gap)
            self.max_gap_s = max(self.max_gap_s, gap)
            if gap > 3 * period_s + 1e-3:
                self.late_polls += 1
                if len(self.gaps) < 50:
                    self.gaps.append((round(self.last - t0, 3), round(gap * 1e3, 1)))
        self.last = now
