"""Where the switch controller reads the lossless queues: the kernel's counters, or netlink.

Both sources answer the same questions, so the controller's loop is one loop:

    read()      lossless bytes queued in each switch, by port (each poll: fast):
                exact = True: by the ingress port they came in by (what a switch
                charges a pause to); exact = False: by egress port (the controller
                then charges them to ingress ports by their upstreams' shares)
    stats()     every port's (backlog, drops, bytes sent)            (shares, timeline)
    close()

- KernelSource (the default where it loads): fabric.queue_counters counts lossless
  bytes into each port's queue (clsact egress, also by the port they came in by) and
  out of it (the peer's clsact ingress) in a BPF map the controller has mapped into
  its memory: no system call per poll. An egress queue is FIFO, so what it holds is
  the last `backlog` bytes it took in: a history of its per-ingress counts, one
  snapshot per poll while it is not empty, says whose bytes those are (interpolated
  within one poll). Drops, which the counters cannot see, come from a netlink dump of
  a tenth of the nodes at each stats(); bytes a qdisc dropped are taken out.
- NetlinkSource (the fallback where the counters are unavailable): one RTM_GETQDISC
  dump per switch each poll (fabric.qdisc_poller, ~60 us per switch), hosts at stats()
  time; no faster than every 1 ms.
"""

from __future__ import annotations

import time
from collections import deque

from fabric.qdisc_poller import QdiscPoller
from fabric.queue_counters import QueueCounters
from fabric.queue_wake import MECHANISM as WAKE_MECHANISM
from fabric.queue_wake import Waker
from fabric.switch_ports import QdiscStats

Stats = dict[str, dict[int, QdiscStats]]       # node -> ifindex -> (backlog, drops, sent)
Queued = dict[str, dict[int, int]]             # switch -> port ifindex -> bytes (> 0)


class NetlinkSource:
    """A netlink dump of the lossless qdiscs per switch, each poll."""

    min_period_ms = 1.0
    exact = False

    def __init__(self, pollers: dict[str, QdiscPoller], switches: list[str], why: str):
        self.pollers = pollers
        self.switches = switches
        self.hosts = [n for n in pollers if n not in switches]
        self.name = f"netlink dump per switch ({why})"
        self.last: Stats = {}

    def read(self) -> Queued:
        """Backlog by egress port, for the switches with any."""
        out: Queued = {}
        for s in self.switches:
            self.last[s] = st = self.pollers[s].poll()
            queued = {i: v[0] for i, v in st.items() if v[0]}
            if queued:
                out[s] = queued
        return out

    def stats(self, fresh: bool = False) -> Stats:
        """Hosts polled now, switches as of the last poll (all of them now if `fresh`)."""
        if fresh:
            self.read()
        for h in self.hosts:
            self.last[h] = self.pollers[h].poll()
        return dict(self.last)

    def close(self) -> None:
        pass


def waker_for(source, switch_lb: bool) -> tuple[Waker | None, str]:
    """Whether the controller can sleep while nothing is queued (the kernel's wake-up,
    fabric.queue_wake), and how it wakes or why it cannot."""
    if not isinstance(source, KernelSource):
        return None, f"never: {source.name}"
    if switch_lb:
        return None, "never: switch load balancing reads the ports' load at every poll"
    if source.queues.waker is None:
        return None, f"never: {source.queues.wake_unavailable}"
    return source.queues.waker, WAKE_MECHANISM


OVERFLOW_DUMP_GAP_S = 0.002    # a switch over its limit is dumped at most this often


class KernelSource:
    """Occupancy from the eBPF counters of every port (`queues`: switch ports first,
    attributed by ingress); drops from netlink dumps, a tenth of the nodes at each
    stats() (every node in 200 ms at the controller's 20 ms timeline period): a dump of
    every node at once would stall one poll by ~2 ms."""

    min_period_ms = 0.0
    exact = True
    name = "kernel: tc clsact eBPF byte counters"

    def __init__(self, queues: QueueCounters, pollers: dict[str, QdiscPoller],
                 index: dict[str, dict[str, int]], limits: list[int] | None = None):
        self.queues = queues
        # Each switch slot's queue limit: a count above it means the qdisc dropped
        # bytes the counters still hold (read() then dumps that switch at once).
        self.limits = limits
        self.overflow_dumps = 0
        self.dumped_at: dict[str, float] = {}
        self.load_history: deque[list[int]] | None = None    # track_load
        self.pollers = pollers
        n = len(queues.slots)
        self.dropped = [0] * n                         # counted in, dropped by the qdisc
        self.drops = [0] * n                           # the qdisc's drops (frames)
        self.last_drops: list[int | None] = [None] * n
        self.seen: list[tuple | None] = [None] * n      # counts at the node's last dump
        self.ifindex = [index[s.node][s.ifname] for s in queues.slots]
        self.node_of = [s.node for s in queues.slots]
        attributed = [s for s in queues.slots if s.ingress_ports]
        self.switch_slots = len(attributed)             # they come first
        self.ingress_range = [(s.ingress_base, s.ingress_base + len(s.ingress_ports))
                              for s in attributed]
        self.ingress_index = [[index[s.node][i] for i in s.ingress_ports] for s in attributed]
        self.history: dict[int, list[tuple[int, list[int]]]] = {}   # slot: (total, bytes)
        # at the last read(), each non-empty switch slot's bytes by the port they came in
        # by (queues.slots[k].ingress_ports order; the last entry: any other)
        self.by_slot: dict[int, list[int]] = {}
        self.handle = [s.handle for s in queues.slots]    # 0: the port's only queue
        self.previous = self.entry_bytes()
        self.slots_of: dict[str, list[int]] = {}
        for k, node in enumerate(self.node_of):
            self.slots_of.setdefault(node, []).append(k)
        self.nodes = list(self.slots_of)
        self.per_call = max(1, -(-len(self.nodes) // 10))
        self.turn = 0

    def entry_bytes(self) -> list[int]:
        """The bytes of every entry of the map (queue_counters.QueueCounters.values holds
        bytes and frames, interleaved), read now."""
        return self.queues.values[0:2 * self.queues.entries:2].tolist()

    def occupancy(self, now: list[int], slots: int) -> list[int]:
        """Bytes in minus bytes out minus bytes dropped, for the first `slots` slots."""
        dropped = self.dropped
        return [now[2 * k] - now[2 * k + 1] - dropped[k] for k in range(slots)]

    def read(self) -> Queued:
        """Bytes queued in each switch by the ingress port they came in by, for the
        switches with any. Plain lists: a handful of entries per port, where numpy's
        per-call cost would dominate."""
        now = self.entry_bytes()
        occ = self.occupancy(now, self.switch_slots)
        if self.limits is not None and self._reconcile_overflow(occ):
            now = self.entry_bytes()
            occ = self.occupancy(now, self.switch_slots)
        if self.load_history is not None:
            self._write_load(now)
        for k in [k for k in self.history if occ[k] <= 0]:
            del self.history[k]                         # an empty queue: forget it
        out: Queued = {}
        self.by_slot = by_slot = {}
        for k, q in enumerate(occ):
            if q <= 0:
                continue
            a, b = self.ingress_range[k]
            vec = now[a:b + 1]
            total = sum(vec)
            hist = self.history.get(k)
            if hist is None:          # it filled since the last poll: start from there
                before = self.previous[a:b + 1]
                hist = self.history[k] = [(sum(before), before)]
            if hist[-1][0] != total:
                hist.append((total, vec))
            queued = by_slot[k] = self._queued(hist, total - q, vec)
            ports, mine = self.ingress_index[k], out.setdefault(self.node_of[k], {})
            for j, got in enumerate(queued[:-1]):      # the last entry: not a port
                if got > 0:
                    mine[ports[j]] = mine.get(ports[j], 0) + got
        self.previous = now
        return {s: d for s, d in out.items() if d}

    def arm(self) -> bool:
        """Arm the kernel's wake-up (fabric.queue_wake) for a controller about to sleep;
        False, and disarmed, if a switch queued a byte since the last read(). The
        counters are read after the flag is set (an atomic in the kernel), so a frame
        either shows here or wakes the controller."""
        waker = self.queues.waker
        waker.arm()
        if any(q > 0 for q in self.occupancy(self.entry_bytes(), self.switch_slots)):
            waker.disarm()
            return False
        return True

    def disarm(self) -> float | None:
        """After a sleep: the time of the frame that woke it (None: it was not a frame)."""
        waker = self.queues.waker
        waker.disarm()
        return waker.drain()

    def track_load(self, polls: int) -> None:
        """From now on, every read() writes each switch port's load for fabric.switch_lb:
        the bytes it took in over the last `polls` polls."""
        self.load_history = deque(maxlen=polls + 1)

    def _write_load(self, now: list[int]) -> None:
        got = [now[2 * k] for k in range(self.switch_slots)]
        hist = self.load_history
        hist.append(got)
        old, set_load = hist[0], self.queues.set_load
        for k in range(self.switch_slots):
            set_load(k, got[k] - old[k])

    def _reconcile_overflow(self, occ: list[int]) -> bool:
        """Dump at once every switch with a queue counted above its limit (its qdisc
        dropped what the counters still hold), at most once per OVERFLOW_DUMP_GAP_S per
        switch; True if any was dumped. Without it, the dropped bytes stayed counted
        until the switch's turn (up to 200 ms): a port that dropped in a burst read
        several times its real queue for that long, and with ECN on marked every frame
        (a DCQCN incast cut its senders to 1-2 % of the line where 20 % was their share)."""
        limits = self.limits
        nodes = {self.node_of[k] for k, q in enumerate(occ) if q > limits[k]}
        if not nodes:
            return False
        t = time.monotonic()
        done = False
        for node in nodes:
            if t - self.dumped_at.get(node, 0.0) >= OVERFLOW_DUMP_GAP_S:
                self.dumped_at[node] = t
                self._poll_drops(node)
                self.overflow_dumps += 1
                done = True
        return done

    @staticmethod
    def _queued(hist: list[tuple[int, list[int]]], cut: int, vec: list[int]) -> list[int]:
        """Per ingress, the bytes a FIFO queue took in after its first `cut` bytes (what
        it still holds): the snapshot at `cut`, interpolated, subtracted from `vec`."""
        while len(hist) > 1 and hist[1][0] <= cut:
            del hist[0]
        t0, v0 = hist[0]
        if t0 < cut and len(hist) > 1:
            t1, v1 = hist[1]
            f = (cut - t0) / (t1 - t0)
            return [int(x - (a + (b - a) * f)) for x, a, b in zip(vec, v0, v1, strict=True)]
        return [x - a for x, a in zip(vec, v0, strict=True)]

    def stats(self, fresh: bool = False) -> Stats:
        """Backlog and bytes sent from the counters, drops from the dumps (this call's
        share of the nodes, or all of them if `fresh`)."""
        if fresh:
            todo = self.nodes
        else:
            todo = [self.nodes[(self.turn + i) % len(self.nodes)] for i in range(self.per_call)]
            self.turn = (self.turn + self.per_call) % len(self.nodes)
        for node in todo:
            self._poll_drops(node)
        now = self.entry_bytes()
        occ = self.occupancy(now, len(self.node_of))
        out: Stats = {}
        for k, node in enumerate(self.node_of):
            mine, ifindex = out.setdefault(node, {}), self.ifindex[k]
            got = (max(0, occ[k]), self.drops[k], now[2 * k + 1])
            was = mine.get(ifindex)      # a port of several queues: their sum
            mine[ifindex] = got if was is None else tuple(a + b for a, b in zip(was, got,
                                                                             strict=True))
        return out

    def _poll_drops(self, node: str) -> None:
        """The drops of `node`'s ports, and what the counters hold beyond each qdisc's
        real backlog (bytes counted in that the qdisc dropped). Where a port's drops grew,
        the excess (bytes in - out - backlog, read microseconds apart) is only raised,
        never lowered. A frame leaving between the reads then goes uncounted as dropped:
        the port once read one frame full for ever after, and with XON under one frame
        (an NVLink port's XON is 2 kB) it held its upstream paused until the run timed
        out (rail-only all-to-all, 2 of 9 runs). So a port whose counts have not moved
        since the node's last dump, nor during this one, is set exactly: nothing can be
        in flight on a port idle that long (a busy port is never set so, since a frame
        between its queue and the peer's counter would be taken for dropped)."""
        counts = self.queues.counts
        slots = self.slots_of[node]
        before = [counts(k) for k in slots]
        poller = self.pollers[node]
        tc = poller.poll()
        for k, was in zip(slots, before, strict=True):
            got = (poller.detail.get((self.ifindex[k], self.handle[k])) if self.handle[k]
                   else tc.get(self.ifindex[k]))
            if got is None:
                continue
            last, self.last_drops[k] = self.last_drops[k], got[1]
            grew = last is not None and got[1] > last
            if grew:
                self.drops[k] += got[1] - last
            now = counts(k)
            excess = now[0] - now[2] - got[0]
            if now == was == self.seen[k]:
                self.dropped[k] = max(0, excess)
            elif grew:
                self.dropped[k] = max(self.dropped[k], excess)
            self.seen[k] = now
            self.queues.set_dropped(k, self.dropped[k])     # for the ECN programs

    def close(self) -> None:
        self.queues.close()
