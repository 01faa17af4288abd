"""Congestion control at the endpoints: DCQCN (Zhu et al., SIGCOMM 2015) as pure state.

    switch egress marks CE (fabric.queue_counters) ──▶ receiver (NP): CE on a data packet
        ──▶ a CNP (BTH opcode 0x81) at once, then at most one per QP per `cnp_interval`,
        at the interval's end if a marked packet came within it ──▶ sender (RP):
    Dcqcn.on_cnp: target = current rate, current x (1 - alpha/2), alpha up
    every `timer` without a CNP: alpha x (1 - g);  every `timer` and every `byte_counter`
    bytes sent: a rate-increase event, fast recovery (F events: current -> (target +
    current) / 2), then additive (target + R_AI) and, once both counters passed F, hyper
    increase (target + R_HAI);  the agent paces the QP's packets at the current rate.

No sockets and no clock of their own (the agent passes `now`, CLOCK_MONOTONIC ns), so
unit tests drive them. One `Dcqcn` per QP (an agent's flows to one peer share it, as a
NIC's flows on one QP do); the agent paces only while DCQCN holds the rate below the
port's (`active`), so a QP that never saw a CNP runs exactly as without DCQCN.

Parameters are given in real units, as the paper gives them, and scaled to the emulated
fabric by its `scale_factor` (`DcqcnSettings.dcqcn_emulated`): a time is multiplied by it (an
emulated packet takes scale_factor times longer than the real one it stands for), a
rate is a fraction of the port's rate, bytes stay bytes (rate x time is the same at any
scale). Defaults: N (CNP interval) 50 us, K = T (alpha and rate-increase timer) 55 us,
g = 1/256, B = 10 MB, F = 5 (the DCQCN paper's, as htsim's DCQCN model uses them);
R_AI = line rate / 1000 (the paper's 40 Mb/s on 40 Gb/s ports), R_HAI = 10 R_AI (the
ratio of NVIDIA ConnectX's rpg_hai_rate to rpg_ai_rate), minimum rate line / 1000.
Hyper increase adds R_HAI per event, as ConnectX NICs do (the paper's i x R_HAI grows it
per event).
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.settings import setting

RATE_SAMPLES_MAX = 4000          # rate changes kept per QP for the timeline


@dataclass
class DcqcnSettings:
    """DCQCN (cc dcqcn): its parameters in real units, as the paper gives them

    Times scale by the fabric's scale_factor, fractions are of the port's rate, bytes stay
    bytes (`dcqcn_emulated`)."""

    dcqcn_cnp_interval_us: float = setting(
        50.0, "N: at most one CNP per QP per interval, us (NP)", number=True, low=0,
        low_open=True, metavar="US")
    dcqcn_timer_us: float = setting(
        55.0, "K and T: the alpha decay and rate-increase timer, us (RP)", number=True,
        low=0, low_open=True, metavar="US")
    dcqcn_g: float = setting(1 / 256, "alpha's gain g", number=True, low=0, low_open=True,
                             high=1)
    dcqcn_byte_counter_bytes: int = setting(
        10_000_000, "B: a rate-increase event per B bytes sent", whole=True, low=1,
        metavar="BYTES")
    dcqcn_fast_recovery: int = setting(
        5, "F: rate-increase events of fast recovery before the rate grows", whole=True,
        low=1, metavar="EVENTS")
    dcqcn_rai_fraction: float = setting(
        0.001, "R_AI, the additive increase, over the line rate", number=True, low=0,
        low_open=True, high=1)
    dcqcn_rhai_fraction: float = setting(
        0.01, "R_HAI, the hyper increase, over the line rate", number=True, low=0,
        low_open=True, high=1)
    dcqcn_min_rate_fraction: float = setting(
        0.001, "the lowest rate over the line rate", number=True, low=0, low_open=True,
        high=1)

    def dcqcn_emulated(self, scale_factor: float) -> dict:
        """The agents' parameters: times x scale_factor in ns, fractions and bytes as
        they are."""
        return {"cnp_interval_ns": int(self.dcqcn_cnp_interval_us * 1000 * scale_factor),
                "timer_ns": int(self.dcqcn_timer_us * 1000 * scale_factor),
                "g": float(self.dcqcn_g),
                "byte_counter_bytes": int(self.dcqcn_byte_counter_bytes),
                "fast_recovery": int(self.dcqcn_fast_recovery),
                "rai_fraction": float(self.dcqcn_rai_fraction),
                "rhai_fraction": float(self.dcqcn_rhai_fraction),
                "min_rate_fraction": float(self.dcqcn_min_rate_fraction)}



class Dcqcn:
    """One QP's reaction point: its current rate (`rc`), target rate (`rt`), alpha, and
    when its next packet may go (`next_ns`, while `active`). Rates in bit/s."""

    __slots__ = ("line", "rc", "rt", "alpha", "g", "timer_ns", "byte_counter", "f",
                 "rai", "rhai", "min_rate", "burst_ns", "active", "t_stage", "b_stage",
                 "bytes", "next_timer_ns", "alpha_at_ns", "last_cnp_ns", "next_ns",
                 "ns_per_byte", "cnps", "cuts", "increases", "lowest", "timeline")

    def __init__(self, line_mbps: float, params: dict, burst_ns: int = 0):
        self.line = line_mbps * 1e6
        self.rc = self.rt = self.lowest = self.line
        self.alpha = 1.0
        self.g = params["g"]
        self.timer_ns = params["timer_ns"]
        self.byte_counter = params["byte_counter_bytes"]
        self.f = params["fast_recovery"]
        self.rai = params["rai_fraction"] * self.line
        self.rhai = params["rhai_fraction"] * self.line
        self.min_rate = params["min_rate_fraction"] * self.line
        self.burst_ns = burst_ns      # pacing credit a late wake-up may use at once
        self.active = False           # the rate is below the line rate: pace
        self.t_stage = self.b_stage = self.bytes = 0
        self.next_timer_ns = 0
        self.alpha_at_ns = 0          # alpha decays from here, one step per timer
        self.last_cnp_ns: int | None = None
        self.next_ns = 0
        self.ns_per_byte = 8e9 / self.line
        self.cnps = self.cuts = self.increases = 0
        self.timeline: list[tuple[int, float]] = []

    def _decay_alpha(self, now_ns: int) -> None:
        """Alpha x (1 - g) for every whole timer period since the last CNP or decay."""
        steps = (now_ns - self.alpha_at_ns) // self.timer_ns
        if steps > 0:
            self.alpha *= (1 - self.g) ** steps
            self.alpha_at_ns += steps * self.timer_ns

    def _set_rate(self, now_ns: int, rc: float) -> None:
        self.rc = rc
        self.ns_per_byte = 8e9 / rc
        if rc < self.lowest:
            self.lowest = rc
        if len(self.timeline) < RATE_SAMPLES_MAX:
            self.timeline.append((now_ns, rc))

    def on_cnp(self, now_ns: int) -> None:
        """A CNP: cut the rate by alpha / 2, raise alpha, restart both counters."""
        self.cnps += 1
        if self.last_cnp_ns is not None:   # alpha decayed while no CNP came
            self._decay_alpha(now_ns)
        self.rt = self.rc
        self._set_rate(now_ns, max(self.min_rate, self.rc * (1 - self.alpha / 2)))
        self.alpha = (1 - self.g) * self.alpha + self.g
        self.alpha_at_ns = now_ns
        self.cuts += 1
        self.t_stage = self.b_stage = self.bytes = 0
        self.next_timer_ns = now_ns + self.timer_ns
        self.last_cnp_ns = now_ns
        if not self.active:
            self.active = True
            self.next_ns = now_ns

    def _increase(self, now_ns: int) -> None:
        t, b, f = self.t_stage, self.b_stage, self.f
        if max(t, b) >= f:              # past fast recovery: raise the target
            self.rt = min(self.line, self.rt + (self.rhai if min(t, b) > f else self.rai))
        self.increases += 1
        rc = (self.rt + self.rc) / 2
        if rc >= self.line * 0.999:     # back at line rate: stop pacing
            self.rt = self.line
            self._set_rate(now_ns, self.line)
            self.active = False
        else:
            self._set_rate(now_ns, rc)

    def tick(self, now_ns: int) -> int | None:
        """Run every timer that fell due by `now_ns`; when to call again (None: idle)."""
        if not self.active:
            return None
        self._decay_alpha(now_ns)
        while self.active and self.next_timer_ns <= now_ns:
            self.t_stage += 1
            self._increase(self.next_timer_ns)
            self.next_timer_ns += self.timer_ns
        return self.next_timer_ns if self.active else None

    def on_sent(self, now_ns: int, nbytes: int) -> None:
        """A packet of `nbytes` went out: the pacing clock and the byte counter."""
        if not self.active:
            return
        start = self.next_ns
        if start < now_ns - self.burst_ns:
            start = now_ns - self.burst_ns
        self.next_ns = start + nbytes * self.ns_per_byte
        self.bytes += nbytes
        if self.bytes >= self.byte_counter:
            self.bytes -= self.byte_counter
            self.b_stage += 1
            self._increase(now_ns)

    def results(self) -> dict:
        return {"cnps": self.cnps, "cuts": self.cuts, "increases": self.increases,
                "line_mbps": self.line / 1e6, "lowest_mbps": round(self.lowest / 1e6, 4),
                "final_mbps": round(self.rc / 1e6, 4), "alpha": round(self.alpha, 5),
                "rate_mbps": [[t, round(r / 1e6, 4)] for t, r in self.timeline]}


class CnpGate:
    """The notification point's rate limit, as the DCQCN paper's NP: a CE-marked packet
    of a QP that had no CNP in the last `interval` gets one at once; after that, at
    most one CNP per QP per interval, sent when the interval ends if a marked packet
    arrived within it (`held`: the agent sends it then, `held_cnps`, through `flow`,
    any of the QP's flows), not at the first marked packet after it: while the queue
    stays marked the sender gets a CNP every interval, so its rate-increase timer (55 us
    against N = 50 us) does not run out between two CNPs and raise the rate in the
    middle of congestion."""

    __slots__ = ("interval_ns", "last_ns", "sent", "ce", "held", "flow")

    def __init__(self, interval_ns: int, flow=None):
        self.interval_ns = interval_ns
        self.last_ns: int | None = None
        self.sent = 0
        self.ce = 0                   # CE-marked data packets seen on the QP
        self.held = False             # a mark arrived since the last CNP: one is due
        self.flow = flow

    def on_ce(self, now_ns: int) -> bool:
        """A CE-marked packet arrived: True if a CNP goes out for it now."""
        self.ce += 1
        last = self.last_ns
        if last is not None and now_ns - last < self.interval_ns:
            self.held = True
            return False
        self._sent(now_ns)
        return True

    def fire(self, now_ns: int) -> bool:
        """True if a CNP held in the interval is due by `now_ns` (then it is sent)."""
        if not self.held or now_ns - self.last_ns < self.interval_ns:
            return False
        self._sent(now_ns)
        return True

    def _sent(self, now_ns: int) -> None:
        self.last_ns = now_ns
        self.held = False
        self.sent += 1


def held_cnps(gates, now_ns: int, nxt: int) -> tuple[list[CnpGate], int]:
    """The gates whose held CNP is due by `now_ns` (they count it as sent), and the
    earlier of `nxt` and the end of any interval still running (a mark may be held
    in it by then)."""
    due = []
    for gate in gates:
        if gate.fire(now_ns):
            due.append(gate)
        elif gate.last_ns is not None:
            end = gate.last_ns + gate.interval_ns
            if now_ns < end < nxt:
                nxt = end
    return due, nxt


def agent_results(sends: list, gates: dict[str, CnpGate], ce_packets: int, cnps_sent: int,
                  cnps_received: int, cnps_unknown: int) -> dict:
    """An agent's part of metrics.json "cc" (testbed.cc_results): CE marks it saw and
    CNPs it sent as a receiver (per peer), CNPs it got and each QP's rate as a sender."""
    qps = {f.dst: f.cc for f in sends if f.cc is not None}
    return {"algorithm": "dcqcn", "ce_packets": ce_packets, "cnps_sent": cnps_sent,
            "cnps_received": cnps_received, "cnps_unknown": cnps_unknown,
            "cnps_by_peer": {src: g.sent for src, g in gates.items()},
            "ce_by_peer": {src: g.ce for src, g in gates.items()},
            "qps": {peer: cc.results() for peer, cc in qps.items()}}
