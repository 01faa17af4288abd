"""A credit-scheduled fabric (voq = "scheduled"): every destination's egress port grants
its line rate to the queues that hold frames for it, and nothing enters the fabric
without a grant (Meta's DSF, Broadcom's Jericho/Ramon, EQDS at the edge).

    sender s's queue for destination d (the VOQ the ingress leaf keeps for d, on the
    upstream side of the link s -> leaf as every VOQ here: fabric.voq)
      │  demand: bytes in it, or bytes entered it in the last few polls (the eBPF counters
      │  at s's egress and the leaf's ingress, fabric.queue_counters), read every poll
      ▼
    egress d: its line rate B_d x f_d shared equally among the n_d queues with demand;
    each queue's tbf is set to B_d x f_d / n_d (a queue without demand back to a trickle:
    its next frame is its request), and a credit frame naming d and the rate granted
    (fabric.wire, opcode 2) leaves the leaf's port toward s. f_d is 0.98 while d's own
    port queue stays short and steps down while it builds (FILLS): the credits follow
    what the port really drains, as a real egress issues them for the buffer it frees
      ▼
    the frames leave at their grant, sprayed by the hosts' entropy over every spine: the
    frames for d never arrive faster than d's port drains them, so the spines' and the
    leaves' queues stay near empty and no pause is sent anywhere: a burst the rates
    cannot hold (the one frame each queue sends as its request, a grant's two frames)
    waits in the switches' buffers, and a frame they drop is counted as a lossless drop.

What is per packet and what is a controller: the queues, the shaping at the granted rate,
the spraying and every frame's forwarding are the kernel's, per packet; the request
(bytes waiting), the grant (a tc change of one tbf) and the credit frame are this
controller's, once per change of a destination's set of senders or of its fill. The
credit loop takes one poll (GRANT_PERIOD_S, 2 ms, or pfc_poll_ms if longer) plus one tc
change (about 15 us each, the rate written into a message encoded once: TbfRate): at the
default x4000 scale 2 ms emulated is 0.5 us real, within a real fabric's credit round
trip of a few microseconds. A queue that goes quiet keeps its grant for IDLE_GRANTS
polls, so a window-limited sender waiting for its ACKs is not re-granted.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from fabric.lossless import (
    HOLD_RATE_BYTES_PER_S,
    LOSSLESS_MTU_BYTES,
    SwitchSettings,
    TbfRate,
    voq_class,
    voq_handle,
)
from fabric.queue_counters import CountersUnavailableError
from fabric.shaping import ETH_HEADER_BYTES, mbps_to_bytes_per_s
from fabric.switch_control import controller_running
from fabric.switch_occupancy import KernelSource
from fabric.switch_ports import ControllerTuning
from fabric.voq_control import VoqController, VoqPair, voq_controller_running
from fabric.wire import VoqOpcode, voq_frame

# The share of the egress's line rate granted, in steps: the first while its queue stays
# short; a step down each poll it holds more than EGRESS_HIGH_FRAMES and still grows (the
# emulated port drains below its nominal rate when its shaping timers run late), a step
# up after CALM_POLLS polls with nothing queued. Every change of a grant refills the
# queue's bucket (tbf): a queue with frames waiting sends a bucket at once. So a grant is
# changed only when its share or its step does, and a destination's grants change again
# only once its port has had the time to drain those buckets (one a queue changed).
FILLS = (0.98, 0.95, 0.92, 0.88, 0.84, 0.80, 0.75, 0.70, 0.60, 0.50)
EGRESS_HIGH_FRAMES = 8
CALM_POLLS = 8
GRANT_PERIOD_S = 0.002     # the controller polls (and grants) at least this far apart
IDLE_GRANTS = 2            # a queue without demand for this many polls loses its grant
# A granted tbf's bucket, in lossless frames: each frame past the bucket waits for its
# tokens on a timer, so a bucket of two arms half the timers of one; a grant's change
# lets a full bucket out at once.
CREDIT_BURST_FRAMES = 2


@dataclass
class Granted:
    """One sender's queue for one destination, under the scheduler."""

    pair: VoqPair           # the leaf's ingress from the sender, the destination
    slot: int               # its eBPF counter slot
    last_in: int = 0        # bytes it had taken in at the last poll
    idle: int = IDLE_GRANTS  # decisions since its last demand
    share: tuple = (0, 0)   # (the senders it shares the egress with, 0: no grant; fill)
    grants: int = 0         # grants sent to it (credit frames)
    tbf: TbfRate | None = None   # its tc change, the rate written in per grant


@dataclass
class Egress:
    """One destination's egress port and the queues it grants."""

    dest: str
    mbps: float
    slot: int                     # the eBPF counter slot of its port's lossless queue
    queues: list[Granted] = field(default_factory=list)
    level: int = 0                # FILLS[level] of its line rate is granted
    calm: int = 0                 # polls since its queue last held a frame
    queued: int = 0               # bytes in its queue at the last poll
    next_grant: float = 0.0       # its grants may change from then on (monotonic s)
    steps_down: int = 0


class ScheduledController(VoqController):
    """VoqController whose edge queues send only at the rate their destination grants
    (module doc). Needs the eBPF counters: a grant is decided on every poll from the
    bytes waiting at every sender."""

    STATE = (*VoqController.STATE, "grant_rows", "fill_rows")

    def __init__(self, fab, settings: SwitchSettings, tuning: ControllerTuning | None = None):
        super().__init__(fab, settings, tuning)
        self.egress: dict[str, Egress] = {}      # destination -> its port and queues
        self.grant_rows: list[dict] = []
        self.fill_rows: list[dict] = []

    def _open(self) -> None:
        super()._open()
        if not isinstance(self.source, KernelSource):
            raise CountersUnavailableError(
                "voq \"scheduled\" decides every grant from the bytes waiting at every "
                f"sender, which only the eBPF counters read each poll: {self.source.name}")
        # the scheduler reads the senders' queues every poll: it never sleeps, and polls
        # every GRANT_PERIOD_S at most
        self.waker, self.calibration["sleep"] = None, "off: the scheduler polls the senders"
        self.period_s = max(self.period_s, GRANT_PERIOD_S)
        g, plan = self.fab.topo.graph, self.fab.plan
        slot_of = {(s.node, s.ifname, s.sub): s.index for s in self.source.queues.slots}
        for p in self.pairs:
            if g.nodes[p.ing.upstream].get("forwards"):
                continue                      # inside the fabric: nothing granted there
            d = p.dest
            e = self.egress.get(d)
            if e is None:
                (last,) = g.adj[d]            # an endpoint of a leaf-spine: one port
                e = self.egress[d] = Egress(d, g.edges[d, last]["rate_mbps"],
                                            slot_of[(last, plan.port(last, d).ifname, 0)])
            k = self.dests[(p.ing.upstream, p.ing.up_ifname)].index(d)
            e.queues.append(Granted(
                p, slot_of[(p.ing.upstream, p.ing.up_ifname, k + 1)],
                tbf=TbfRate(p.ing.up_index, voq_handle(k), voq_class(k),
                            CREDIT_BURST_FRAMES * (LOSSLESS_MTU_BYTES + ETH_HEADER_BYTES),
                            int(p.ing.queue_bytes))))
        now = self.source.entry_bytes()
        for e in self.egress.values():
            for q in e.queues:                # no grant yet: every queue waits for one
                q.last_in = now[2 * q.slot]
                self.pollers[q.pair.ing.upstream].request(
                    q.tbf.message(HOLD_RATE_BYTES_PER_S))

    def _voq_step(self, p: VoqPair, now: float, t_prev: float | None) -> None:
        """No pause: the grants and the egress's own queue (FILLS) keep the fabric's
        queues short; a frame dropped in spite of them is counted, never hidden."""

    def _evaluate(self, queued, now: float, t_prev: float | None) -> None:
        super()._evaluate(queued, now, t_prev)
        self._schedule(now)

    def _schedule(self, t: float) -> None:
        """Each destination's grants from its senders' demand and its own queue (module
        doc)."""
        now = self.source.previous           # read() took them this poll
        dropped = self.source.dropped
        frame = LOSSLESS_MTU_BYTES + ETH_HEADER_BYTES
        high = EGRESS_HIGH_FRAMES * frame
        last_level = len(FILLS) - 1
        kicks = set()
        for e in self.egress.values():
            k = e.slot
            queued = now[2 * k] - now[2 * k + 1] - dropped[k]
            growing, e.queued = queued > e.queued, queued
            if queued > high and growing:
                e.calm = 0
                if e.level < last_level:
                    e.level += 1
                    e.steps_down += 1
            elif queued > 0:
                e.calm = 0                    # draining: its grants hold
            else:
                e.calm += 1
                if e.calm >= CALM_POLLS and e.level:
                    e.level -= 1
                    e.calm = 0
            active = 0
            for q in e.queues:
                took = now[2 * q.slot]
                waiting = took - now[2 * q.slot + 1] - dropped[q.slot]
                q.idle = 0 if (waiting > 0 or took > q.last_in) else q.idle + 1
                q.last_in = took
                active += q.idle < IDLE_GRANTS
            if t < e.next_grant:
                continue                      # the last change's frames still drain
            changed = 0
            for q in e.queues:
                want = (active, e.level) if q.idle < IDLE_GRANTS else (0, 0)
                if want != q.share and not q.pair.paused:
                    if not q.share[0] and want[0]:    # its port's qdisc must run again
                        kicks.add((q.pair.ing.upstream, q.pair.ing.up_ifname))
                    self._grant(e, q, want)
                    changed += 1
            if changed:
                e.next_grant = t + (changed * CREDIT_BURST_FRAMES * frame
                                    / mbps_to_bytes_per_s(e.mbps))
        for port in kicks:           # HTB does not run itself on a tc change: one frame
            self._kick(port)        # per port, dropped by its kick class, runs it

    def _kick(self, port: tuple[str, str]) -> None:
        with contextlib.suppress(OSError):
            self.kick_socks[port].send(self.kick_frame)

    def _grant(self, e: Egress, q: Granted, share: tuple) -> None:
        """Set one queue to its share of its destination's egress ((0, 0): a trickle),
        and say so on the wire (the caller runs its port's qdisc when it was ungranted)."""
        p, ing = q.pair, q.pair.ing
        rate = self._rate_bytes(e, share)
        self.pollers[ing.upstream].request(q.tbf.message(rate or HOLD_RATE_BYTES_PER_S))
        q.share = share
        frame = voq_frame(self.fab.plan.port(ing.switch, ing.upstream).mac, p.address,
                          self.settings.traffic_class.priority, opcode=VoqOpcode.CREDIT,
                          credit_bytes=rate)
        with contextlib.suppress(OSError):      # counted only once on the wire
            self.frame_socks[(ing.switch, ing.ifname)].send(frame)
            q.grants += 1

    @staticmethod
    def _rate_bytes(e: Egress, share: tuple) -> int:
        """The bytes a second a queue granted `share` (n, level) may send: FILLS[level] of
        `e`'s line rate over n (0: none)."""
        n, level = share
        return int(mbps_to_bytes_per_s(e.mbps) * FILLS[level] / n) if n else 0

    def _voq_release(self, p: VoqPair, now: float) -> None:
        """A released edge queue goes back to its grant, not to the open rate."""
        super()._voq_release(p, now)
        e = self.egress.get(p.dest)
        for q in e.queues if e else ():
            if q.pair is p:
                self._grant(e, q, q.share)
                self._kick((p.ing.upstream, p.ing.up_ifname))

    def _close(self) -> None:
        for e in self.egress.values():     # nothing stays rate-limited after the run
            for q in e.queues:
                with contextlib.suppress(Exception):
                    self.pollers[q.pair.ing.upstream].request(q.pair.hold_msgs[0])
        self.grant_rows = [{"upstream": q.pair.ing.upstream, "switch": q.pair.ing.switch,
                            "dest": q.pair.dest, "grants": q.grants}
                           for e in self.egress.values() for q in e.queues if q.grants]
        self.fill_rows = [{"dest": e.dest, "fill": FILLS[e.level], "steps_down": e.steps_down}
                          for e in self.egress.values()]
        super()._close()

    def report(self) -> dict:
        out = super().report()
        room = out["headroom"]
        if room["verdict"] == "exceeded" and not out["totals"]["drops"]:
            # no pause was sent, so no reaction was late: what passed XOFF + headroom
            # waited in a switch's buffer, which is what a scheduled fabric's buffer is for
            room["verdict"] = "no_pauses"
            room["notes"] = [*room["notes"], "a scheduled fabric sends no pause: the "
                             "bytes past an ingress's XOFF waited in the switch's buffer "
                             "and none was dropped"]
        rows = self.grant_rows
        out["voq"] |= {
            "scheduled": True,
            "mechanism": ("a queue per destination at every sender's edge, sent only at the "
                          "rate its destination's egress grants (its line rate x "
                          f"{FILLS[0]} or less while its queue builds, shared among the "
                          "senders with bytes for it: tbf changes), credit frames "
                          "(ethertype 0x88B6, opcode 2) from the "
                          "leaf; no pause"),
            "grants": sum(r["grants"] for r in rows),
            "granted_queues": len(rows),
            "grant_rows": rows,
            "fill_least": min((r["fill"] for r in self.fill_rows), default=None),
            "fill_steps_down": sum(r["steps_down"] for r in self.fill_rows)}
        return out


def switches_running(fab, settings: SwitchSettings):
    """The switch controller `settings` ask for, as a context manager: PFC's
    (fabric.switch_control), per destination (voq "on", fabric.voq_control) or this
    module's scheduler (voq "scheduled")."""
    if settings.voq == "off":
        return controller_running(fab, settings)
    return voq_controller_running(fab, settings, controller=(
        ScheduledController if settings.voq == "scheduled" else None))
