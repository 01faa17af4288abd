"""Congestion control for the UET transport (cc = "nscc"): a window per flow, pure state.

    switch egress marks CE (RED) ──▶ the receiver counts CE-marked data packets; each ACK
        echoes the count since the previous one (SACK base word, top byte: traffic.transport)
    ──▶ NsccSender.on_ack: an RTT sample, queuing delay = RTT - base RTT, one of four
        quadrants ──▶ cwnd (packets): the window the UET sender keeps

In the spirit of Ultra Ethernet's network-signal congestion control (NSCC), sender-side,
per flow, with packets sprayed (entropy = spray) or not. Per ACK that newly acknowledges
`acked` packets and echoes `ce` marks:

    rtt   = now - send time of the newest newly acknowledged transmission (no sample when
            that was a resend: Karn); base RTT = the least sample; delay = rtt - base RTT
    CE,    delay >= target: cwnd x (1 - min(max_md, gamma (delay - target) / delay))  } once per
    CE,    delay <  target: cwnd x (1 - ce_gain x min(1, ce / acked))                 } base RTT
    no CE, delay >= target: cwnd + fair_increase x acked / cwnd   (+fair_increase per RTT)
    no CE, delay <  target: cwnd + prop_increase x (1 - delay / target) x acked / cwnd
    every packet declared lost (RACK or RTO, traffic.transport): cwnd - 1

cwnd stays in [min_cwnd, window_packets] and starts at window_packets; the sender keeps
at most floor(cwnd) packets in flight (sent, neither acknowledged nor declared lost), new
ones and resends alike, and the PSN span from the oldest unacknowledged packet stays
within window_packets (UetSender's window). Without ECN (the fabric does not mark: `ecn`
false) delay is the only signal: at or above the target it cuts as "CE, delay >= target"
does, below it the window grows proportionally.

How this differs from UET's NSCC as htsim implements it (uet-htsim, sim/uec.cpp):
- the window starts at, and is capped by, window_packets; UET's starts at 1.5 BDP of the
  fabric's unloaded RTT, and the base RTT starts at that RTT. Here the base RTT is the
  least sample only, so a queue standing from the first window inflates it (low delay
  read where there is a queue): that is why CE with low delay cuts by ce_gain x the marked
  fraction (DCTCP's cut with this ACK's fraction as alpha) where UET only re-routes
  (ce_gain = 0 is UET's hold);
- the decrease uses this ACK's delay, UET an average; increases apply per ACK (UET sums
  them per "fulfil" period) and are fixed packets per RTT (UET scales them with the BDP);
- no quick adapt, no fast increase, no periodic eta, no trimming or NACKs, no path
  penalties from ECN (spraying stays random, traffic.entropy); the window counts packets,
  UET's bytes.

Parameters are in real units (`NsccSettings`, the experiment's `nscc_*` keys) and the
target scaled to the emulated fabric by its scale_factor (`nscc_emulated`), as DCQCN's times
(traffic.cc). Defaults: target 12 us (htsim's reference network RTT; htsim's target
defaults to the fabric's unloaded RTT, x 0.75 with trimming), gamma 0.8 and max_md 0.5
(htsim's), ce_gain 0.5 (DCTCP's 1/2), fair and proportional increase 1 packet per RTT
(htsim's 5a and 4ab MSS per RTT are 1 and 0.8 at a 30 KB BDP: a = BDP / (100 Gb/s x
12 us) = 0.2, b = target / 12 us = 1), min_cwnd 1 packet (htsim's one MTU). The target
must sit below what the switches buffer: 12 us is 4.8 ms at scale factor 400, 15 frames
of 4 KiB at 100 Mbit/s, between ecn_kmin and ecn_kmax; at the default scale factor 4000
it is 48 ms, more than a 128 KiB queue holds (10.5 ms), so delay never reads high there
and only CE marks and losses cut: lower nscc_target_qdelay_us (e.g. 1 us) at that scale.
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.settings import setting
from topologies.stats import percentile
from traffic.transport import UetSender
from traffic.transport_settings import TransportParams

RTT_SAMPLES_MAX = 20_000         # RTT samples kept per flow (the first ones)


@dataclass
class NsccSettings:
    """NSCC (cc nscc, transport uet): its parameters in real units

    The target delay scales by the fabric's scale_factor (`nscc_emulated`)."""

    nscc_target_qdelay_us: float = setting(
        12.0, "queuing delay above which delay counts as high, us", number=True, low=0,
        low_open=True, high=1e9, metavar="US")
    nscc_gamma: float = setting(0.8, "decrease per unit of delay excess (CE, high delay)",
                                number=True, low=0, low_open=True, high=1, high_open=True)
    nscc_max_md: float = setting(0.5, "the largest cut of one decrease", number=True, low=0,
                                 low_open=True, high=1, high_open=True)
    nscc_ce_gain: float = setting(0.5, "cut per marked fraction with CE and low delay",
                                  number=True, low=0, high=1)
    nscc_fair_increase_packets: float = setting(
        1.0, "increase per RTT with no CE and high delay, packets", number=True, low=0,
        high=1e6)
    nscc_prop_increase_packets: float = setting(
        1.0, "increase per RTT at zero delay with no CE, packets", number=True, low=0,
        high=1e6)
    nscc_min_cwnd_packets: float = setting(1.0, "the window never falls below this, packets",
                                           number=True, low=1, high=1e6)

    def nscc_emulated(self, scale_factor: float, ecn: bool = False) -> dict:
        """The agents' parameters: the target x scale_factor in ns, the rest as it is;
        `ecn`: the switches mark CE (else delay is the only signal)."""
        return {"target_ns": int(self.nscc_target_qdelay_us * 1000 * scale_factor),
                "gamma": float(self.nscc_gamma), "max_md": float(self.nscc_max_md),
                "ce_gain": float(self.nscc_ce_gain),
                "fair_increase_packets": float(self.nscc_fair_increase_packets),
                "prop_increase_packets": float(self.nscc_prop_increase_packets),
                "min_cwnd_packets": float(self.nscc_min_cwnd_packets), "ecn": bool(ecn)}


class NsccSender(UetSender):
    """A UET sender whose window is NSCC's cwnd (module docstring); `nscc` is
    `NsccSettings.nscc_emulated()`."""

    def __init__(self, npackets: int, params: TransportParams, nscc: dict):
        super().__init__(npackets, params)
        self.max_cwnd = float(params.window_packets)
        self.min_cwnd = min(float(nscc["min_cwnd_packets"]), self.max_cwnd)
        self.cwnd = self.lowest = self.max_cwnd
        self.target_ns = nscc["target_ns"]
        self.gamma, self.max_md, self.ce_gain = nscc["gamma"], nscc["max_md"], nscc["ce_gain"]
        self.fair = nscc["fair_increase_packets"]
        self.prop = nscc["prop_increase_packets"]
        self.ecn = nscc["ecn"]
        self.sent_ns = [-1]          # send time by transmission number (-1: a resend)
        self.base_rtt_ns: int | None = None
        self.delay_ns = 0            # of the latest sample
        self.last_cut_ns: int | None = None
        self.rtts: list[int] = []
        self.ce_echoed = self.cuts = self.loss_cuts = 0
        self.acked_total = 0
        self.limit = int(self.cwnd)  # packets in flight allowed: floor(cwnd)

    def in_flight(self) -> int:
        """Packets sent and neither acknowledged nor declared lost (a lost packet that was
        acknowledged while it waited for its resend is counted out twice: rare, and only
        lets one more packet go)."""
        return self.next_new - self.acked_total - len(self.resend)

    def ready(self) -> bool:
        return self.in_flight() < self.limit and super().ready()

    def take(self, now_ns: int) -> int:
        if self.next_new - self.acked_total - len(self.resend) >= self.limit:
            return -1
        resent = self.retransmits
        psn = super().take(now_ns)
        if psn >= 0:                 # self.seq went up by one: its send time
            self.sent_ns.append(-1 if self.retransmits != resent else now_ns)
        return psn

    def on_ack(self, now_ns: int, syndrome: int, psn: int, sack_base: int = 0,
               sack_bitmap: int = 0, ce_count: int = 0) -> None:
        queued = len(self.resend)
        super().on_ack(now_ns, syndrome, psn, sack_base, sack_bitmap, ce_count)
        self.ce_echoed += ce_count
        if len(self.resend) > queued:
            self._lost(len(self.resend) - queued)
        acked = self.newly_acked
        if not acked:
            return
        self.acked_total += acked
        sent = self.sent_ns[self.newest_seq]
        if sent >= 0:
            rtt = now_ns - sent
            if self.base_rtt_ns is None or rtt < self.base_rtt_ns:
                self.base_rtt_ns = rtt
            self.delay_ns = rtt - self.base_rtt_ns
            if len(self.rtts) < RTT_SAMPLES_MAX:
                self.rtts.append(rtt)
        self._adjust(now_ns, acked, ce_count)

    def on_timer(self, now_ns: int) -> bool:
        queued = len(self.resend)
        fired = super().on_timer(now_ns)
        if fired and len(self.resend) > queued:
            self._lost(len(self.resend) - queued)
        return fired

    def _adjust(self, now_ns: int, acked: int, ce: int) -> None:
        """One ACK's quadrant (module docstring)."""
        delay, target, cwnd = self.delay_ns, self.target_ns, self.cwnd
        congested = ce > 0 if self.ecn else delay >= target    # without ECN: delay alone
        if congested:
            last = self.last_cut_ns
            if last is not None and now_ns - last < (self.base_rtt_ns or 0):
                return               # at most one decrease per base RTT
            if delay >= target:
                cut = min(self.max_md, self.gamma * (delay - target) / delay)
            else:
                cut = self.ce_gain * min(1.0, ce / acked)
            if cut <= 0:
                return
            self.cuts += 1
            self.last_cut_ns = now_ns
            self._set(cwnd * (1 - cut))
        elif delay >= target:        # a queue without marks: elsewhere, or on the way back
            self._set(cwnd + self.fair * acked / cwnd)
        else:
            self._set(cwnd + self.prop * (target - delay) / target * acked / cwnd)

    def _lost(self, packets: int) -> None:
        self.loss_cuts += packets
        self._set(self.cwnd - packets)

    def _set(self, cwnd: float) -> None:
        cwnd = min(self.max_cwnd, max(self.min_cwnd, cwnd))
        self.cwnd = cwnd
        self.limit = max(1, int(cwnd))
        if cwnd < self.lowest:
            self.lowest = cwnd


def agent_results(sends: list, ce_packets: int, nscc: dict) -> dict:
    """An agent's part of metrics.json "cc": CE marks it saw as a receiver, and per peer
    it sends to (its flows pooled): marks echoed back, cuts, windows, RTT samples."""
    peers: dict[str, dict] = {}
    rtts: dict[str, list[int]] = {}
    for f in sends:
        tx = f.tx
        if not isinstance(tx, NsccSender):
            continue
        p = peers.setdefault(f.dst, {"flows": 0, "ce_echoed": 0, "cuts": 0,
                                     "loss_cuts": 0, "start_cwnd": tx.max_cwnd,
                                     "lowest_cwnd": tx.lowest})
        p["flows"] += 1
        p["ce_echoed"] += tx.ce_echoed
        p["cuts"] += tx.cuts
        p["loss_cuts"] += tx.loss_cuts
        p["lowest_cwnd"] = round(min(p["lowest_cwnd"], tx.lowest), 3)
        p["final_cwnd"] = round(tx.cwnd, 3)       # of the last flow to start
        rtts.setdefault(f.dst, []).extend(tx.rtts)
    for dst, p in peers.items():
        p["rtt_samples"] = len(rtts[dst])
        for key, q in (("base_rtt_us", 0), ("rtt_p50_us", 50), ("rtt_p99_us", 99)):
            v = percentile(rtts[dst], q)
            p[key] = None if v is None else round(v / 1000, 1)
    return {"algorithm": "nscc", "ecn": bool(nscc.get("ecn")),
            "target_us": nscc["target_ns"] / 1000, "ce_packets": ce_packets, "peers": peers}
