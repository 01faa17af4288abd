"""The switch controller with virtual output queues: PFC per destination (fabric.voq).

    switch S, its queues for destination d (on each port its routes send d out of: the
    port's queue for d where its peer forwards, its lossless class where the peer is d)
      │  the bytes each ingress port of S put into them: the eBPF counters count every
      │  queue as a FIFO of its own (fabric.queue_counters, the queue picked by the
      │  frame's destination), read from memory each poll; where they do not load, a
      │  netlink dump of S reads each queue's backlog and `charge` splits it by what each
      │  upstream's queue for d sent
      ▼
    ingress i's bytes for d pass XOFF: a VOQ pause frame naming d (fabric.wire.voq_frame)
    leaves S's port i in its control class, and the upstream's queue for d alone is held
    (its tbf to a trickle, as fabric.lossless holds a whole class); the upstream's other
    queues keep sending. Under XON: a release frame, the queue reopened and its port kicked.

Everything else is fabric.switch_control's: the forked real-time process, the polling
and sleeping, the thresholds (per ingress port, now per destination: the frames of every
ingress for d fill one queue of d at most fan-in x (XOFF + headroom), the buffer they were
sized for), refreshes every half pause, the timeline and the report, which gains `voq`.
A forced pause (pause()) holds every destination of the port; there is no watchdog.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from fabric import netns
from fabric.lossless import (
    LOSSLESS_HANDLE,
    SwitchSettings,
    Thresholds,
    hold_message,
    install,
    voq_class,
    voq_handle,
)
from fabric.qdisc_poller import QdiscPoller
from fabric.queue_counters import CountersUnavailableError, QueueCounters
from fabric.shaping import handle_int
from fabric.switch_control import SwitchController
from fabric.switch_occupancy import KernelSource, NetlinkSource
from fabric.switch_ports import ControllerTuning, Ingress, Reaction, crossing_time
from fabric.voq import port_destinations
from fabric.wire import voq_frame

NETLINK_WHY = "voq: every queue read from its own qdisc"


@dataclass
class VoqPair:
    """One switch ingress port and one destination: the bytes that port put into the
    switch's queues for that destination, and the upstream's queue for it."""

    ing: Ingress
    dest: str
    address: str
    up_handle: int                       # the upstream's queue for dest (its tbf)
    hold_msgs: tuple[bytes, bytes]       # (release, hold) of that queue
    frames: tuple[bytes, bytes]          # (pause, release) sent out of the switch port
    sources: list[tuple[int, int]]       # the switch's queues of dest: (ifindex, handle)
    counted: list[tuple[int, int]]       # the same as (counter slot, this port's entry)
    occupancy: float = 0.0
    prev_occupancy: float = 0.0
    peak_occupancy: float = 0.0
    weight: float = 0.0                  # the upstream queue's bytes sent since last share
    last_sent: int | None = None
    paused: bool = False
    paused_since: float = 0.0
    last_frame: float = 0.0
    holds: int = 0
    held_s: float = 0.0
    frames_sent: int = 0

    @property
    def thresholds(self) -> Thresholds:
        return self.ing.thresholds


class VoqController(SwitchController):
    """SwitchController whose pauses name a destination (module doc). Needs the layout
    fabric.lossless.install(..., voq=True) gives."""

    STATE = (*SwitchController.STATE, "voq_rows")

    def __init__(self, fab, settings: SwitchSettings, tuning: ControllerTuning | None = None):
        super().__init__(fab, settings, tuning)
        self.dests = port_destinations(fab.topo, fab.routes, fab.plan.ports)
        self.pairs: list[VoqPair] = []
        self.voq_rows: list[dict] = []

    # -- setup ---------------------------------------------------------------------------
    def _source(self) -> KernelSource | NetlinkSource:
        """The eBPF counters with a slot per queue (fabric.queue_counters: each queue a
        FIFO of its own); where they do not load, netlink dumps by pollers that read
        every queue of a port (module doc). Either way the pollers read every queue."""
        most = max((len(d) for d in self.dests.values()), default=0)
        more = tuple(handle_int(voq_handle(k)) for k in range(most))
        for node in list(self.pollers):
            with netns.entered(self.fab.ns(node)):
                poller = QdiscPoller(handle_int(LOSSLESS_HANDLE), more)
            self.pollers[node].close()
            self.pollers[node] = poller
        self.calibration["voq"] = (f"{sum(len(d) for d in self.dests.values())} queues on "
                                   f"{len(self.dests)} ports, at most {most} a port")
        why = "eBPF counters off in the controller tuning"
        if self.tuning.kernel_counters:
            plan, graph = self.fab.plan, self.fab.topo.graph
            order = sorted(plan.ports, key=lambda n: n not in self.switches)
            ports = [(n, p.ifname) for n in order for p in plan.ports[n]]
            lossless = handle_int(LOSSLESS_HANDLE)
            voqs = {key: (("", lossless), *((plan.loopback[d], handle_int(voq_handle(k)))
                                            for k, d in enumerate(dests)))
                    for key, dests in self.dests.items()}
            try:
                queues = QueueCounters(self.fab, ports, self.settings.traffic_class.dscp,
                                       attribute=frozenset(self.switches),
                                       wake=self.tuning.sleep, voqs=voqs).attach()
            except CountersUnavailableError as exc:
                why = str(exc)
            else:
                limits = [graph.edges[s.node, s.peer]["queue_bytes"] for s in queues.slots]
                return KernelSource(queues, self.pollers, self.index, limits)
        return NetlinkSource(self.pollers, self.switches, f"{NETLINK_WHY}; {why}")

    def _open(self) -> None:
        super()._open()
        plan, routes = self.fab.plan, self.fab.routes
        prio, quanta = self.settings.traffic_class.priority, self.tuning.quanta
        lossless = handle_int(LOSSLESS_HANDLE)
        slots = self.source.queues.slots if self.source.exact else []
        slot_of = {(sl.node, sl.ifname, sl.sub): sl.index for sl in slots if sl.ingress_ports}
        self.pairs_of: dict[str, list[VoqPair]] = {}       # switch -> its pairs
        self.by_ingress: dict[int, list[VoqPair]] = {}     # id(ingress) -> its pairs
        for ing in self.ingress:
            up_dests = self.dests.get((ing.upstream, ing.up_ifname), ())
            mac = plan.port(ing.switch, ing.upstream).mac
            for k, dest in enumerate(up_dests):
                sources, counted = [], []
                for hop in routes[ing.switch].get(dest, ()):
                    port = plan.port(ing.switch, hop)
                    mine = self.dests.get((ing.switch, port.ifname), ())
                    sub = 1 + mine.index(dest) if dest in mine else 0
                    handle = handle_int(voq_handle(sub - 1)) if sub else lossless
                    sources.append((self.index[ing.switch][port.ifname], handle))
                    slot = slot_of.get((ing.switch, port.ifname, sub))
                    if slot is not None:
                        counted.append((slot, slots[slot].ingress_ports.index(ing.ifname)))
                address = plan.loopback[dest]
                pair = VoqPair(
                    ing, dest, address, handle_int(voq_handle(k)),
                    tuple(hold_message(ing.up_index, ing.rate_mbps, ing.queue_bytes, held,
                                       handle=voq_handle(k), parent=voq_class(k))
                          for held in (False, True)),
                    (voq_frame(mac, address, prio, quanta), voq_frame(mac, address, prio, 0)),
                    sources, counted)
                self.pairs.append(pair)
                self.pairs_of.setdefault(ing.switch, []).append(pair)
                self.by_ingress.setdefault(id(ing), []).append(pair)
        self.sharing: dict[tuple[str, str], list[VoqPair]] = {}   # (switch, dest) -> pairs
        for pair in self.pairs:
            self.sharing.setdefault((pair.ing.switch, pair.dest), []).append(pair)

    def _close(self) -> None:
        self.voq_rows = [{"switch": p.ing.switch, "ifname": p.ing.ifname,
                          "upstream": p.ing.upstream, "dest": p.dest,
                          "holds": p.holds, "held_s": round(p.held_s, 4),
                          "frames_sent": p.frames_sent,
                          "peak_bytes": int(p.peak_occupancy)}
                         for p in self.pairs if p.holds or p.peak_occupancy]
        super()._close()

    # -- the loop --------------------------------------------------------------------------
    def _evaluate(self, queued: dict[str, dict[int, int]], now: float,
                  t_prev: float | None) -> None:
        for s in [*queued, *(h for h in self.hot if h not in queued)]:
            pairs = self.pairs_of.get(s)
            if pairs is None:
                continue
            for p in pairs:
                p.prev_occupancy, p.occupancy = p.occupancy, 0.0
            if self.source.exact:            # whose bytes they are is counted
                by_slot = self.source.by_slot
                for p in pairs:
                    p.occupancy = sum(by_slot[k][j] for k, j in p.counted if k in by_slot)
            else:
                self._charge(s, pairs)
            for ing in self.by_switch.get(s, ()):
                mine = self.by_ingress.get(id(ing), ())
                ing.occupancy = sum(p.occupancy for p in mine)
                ing.peak_occupancy = max([ing.peak_occupancy,
                                          *(p.occupancy for p in mine)])
            if self.settings.enabled:
                for p in pairs:
                    p.peak_occupancy = max(p.peak_occupancy, p.occupancy)
                    self._voq_step(p, now, t_prev)
            if any(p.paused or p.occupancy for p in pairs):
                self.hot.add(s)
            else:
                self.hot.discard(s)

    def _charge(self, s: str, pairs: list[VoqPair]) -> None:
        """Netlink: each destination's backlog in switch `s`, charged by shares (charge)."""
        detail, seen = self.pollers[s].detail, set()
        for p in pairs:
            key = (s, p.dest)
            if key in seen:
                continue
            seen.add(key)
            backlog = sum(detail.get(src, (0,))[0] for src in p.sources)
            if backlog:
                charge(self.sharing[key], backlog)

    def _voq_step(self, p: VoqPair, now: float, t_prev: float | None) -> None:
        th = p.thresholds
        if not p.paused:
            if p.occupancy >= th.xoff_bytes:
                self._voq_xoff(p, now, t_prev)
        elif p.occupancy <= th.xon_bytes:
            self._voq_release(p, now)
        elif now - p.last_frame >= p.ing.pause_s / 2:
            self._voq_send(p, xoff=True, now=now)      # refresh before the quanta expire

    def _voq_send(self, p: VoqPair, xoff: bool, now: float) -> None:
        p.last_frame = now
        if self._send(p.ing, xoff, now, p.frames[0 if xoff else 1]):
            p.frames_sent += 1

    def _voq_xoff(self, p: VoqPair, now: float, t_prev: float | None) -> None:
        ing = p.ing
        self.pollers[ing.upstream].request(p.hold_msgs[1])   # the hold first, as PFC does
        t_done = time.monotonic()
        self._voq_send(p, xoff=True, now=now)
        t_frame = time.monotonic()
        p.paused, p.paused_since = True, now
        p.holds += 1
        if not ing.paused:
            ing.paused, ing.paused_since = True, now
        if t_prev is not None:
            crossing = crossing_time(p, t_prev, now)
            self.reactions.append(Reaction(
                ing.switch, ing.ifname, round(now - self.t0, 4), (t_done - crossing) * 1e3,
                (t_done - t_prev) * 1e3, (t_frame - crossing) * 1e3))

    def _voq_release(self, p: VoqPair, now: float) -> None:
        ing = p.ing
        self._voq_send(p, xoff=False, now=now)
        self.pollers[ing.upstream].request(p.hold_msgs[0])
        with contextlib.suppress(OSError):   # run the upstream's qdisc again
            self.kick_socks[(ing.upstream, ing.up_ifname)].send(self.kick_frame)
        p.paused = False
        p.held_s += now - p.paused_since
        if ing.paused and not any(q.paused for q in self.by_ingress[id(ing)]):
            ing.paused = False
            self.counters[(ing.upstream, ing.up_ifname)].paused_s += now - ing.paused_since

    # a whole port (a forced pause, the end of the run): every destination
    def _xoff(self, ing: Ingress, now: float, t_prev: float | None) -> None:
        for p in self.by_ingress.get(id(ing), ()):
            if not p.paused:
                self._voq_xoff(p, now, t_prev)

    def _release(self, ing: Ingress, now: float, frame: bool) -> None:
        for p in self.by_ingress.get(id(ing), ()):
            if p.paused:
                self._voq_release(p, now)

    def _update_shares(self, stats: dict, dt: float | None) -> None:
        super()._update_shares(stats, dt)
        for p in self.pairs:
            got = (self.pollers[p.ing.upstream].detail or {}).get((p.ing.up_index,
                                                                    p.up_handle))
            if got is not None:
                if p.last_sent is not None and not p.paused:
                    p.weight = got[2] - p.last_sent
                p.last_sent = got[2]

    def report(self) -> dict:
        rows = self.voq_rows
        held = [r for r in rows if r["holds"]]
        out = super().report()
        out["voq"] = {
            "enabled": True,
            "mechanism": ("a lossless queue per destination on every port toward a "
                          "forwarding peer (htb classes, u32 on DSCP and destination), "
                          "held one destination at a time by VOQ pause frames "
                          "(ethertype 0x88B6)"),
            "queues": self.calibration.get("voq", ""),
            "held_queues": len(held),
            "holds": sum(r["holds"] for r in rows),
            "held_destinations": sorted({r["dest"] for r in held}),
            "held_links": sorted({f"{r['upstream']}>{r['switch']}" for r in held}),
            "pairs": rows}
        return out


def charge(pairs: list[VoqPair], backlog: int) -> None:
    """A switch's backlog for one destination, charged to the ingress ports that feed it
    by what each upstream's queue for that destination sent since the last share update;
    before any update, by what each has sent in all (one that never sent is charged
    nothing), and equally when none has sent yet."""
    if len(pairs) == 1:
        pairs[0].occupancy += backlog
        return
    weights = [p.weight for p in pairs]
    if sum(weights) <= 0:
        weights = [p.last_sent or 0 for p in pairs]
    total = sum(weights)
    for p, w in zip(pairs, weights, strict=True):
        p.occupancy += backlog * (w / total if total > 0 else 1 / len(pairs))


@contextlib.contextmanager
def voq_controller_running(fab, settings: SwitchSettings,
                           tuning: ControllerTuning | None = None,
                           controller: type[VoqController] | None = None):
    """Install the per-destination layout, run the VOQ controller (`controller`: it or a
    subclass, fabric.scheduled's) for the block, stop it."""
    install(fab, settings.traffic_class, voq=True)
    ctl = (controller or VoqController)(fab, settings, tuning).start()
    try:
        yield ctl
    finally:
        ctl.stop()
