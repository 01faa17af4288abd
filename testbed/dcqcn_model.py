"""DCQCN on an N:1 incast at the paper's own line rate, as a discrete-event model.

The question it answers: does an emulated incast with DCQCN leave its bottleneck idle
because the emulation scales DCQCN wrongly, or because the paper's parameters do that
at the paper's own rate for flows this short? The model runs the same bytes, the same
parameters in real time (DcqcnSettings.dcqcn_emulated(1): 50 us CNP interval, 55 us
timer, 10 MB byte counter, g = 1/256, R_AI 0.1 % of line) and the agents' own
reaction and notification points (traffic.cc.Dcqcn, CnpGate) at 40 Gb/s: senders start
at line rate, paced at their rate; one output queue drains at line rate and marks CE
on enqueue as the emulated switches do (RED on the instantaneous queue: none below
kmin, linearly up to pmax at kmax, all above); a marked packet reaches the receiver,
whose gate sends CNPs that reach the sender `feedback_us` later. No PFC: the queue is
unbounded and its peak is reported.

    incast(senders=8, message_bytes=4_000_000, line_gbps=40.0) -> {"jct_over_ideal", ...}

Scaling keeps every ratio the reaction point sees: time x s and rate / s leave the
bytes per timer period, and so the byte counter's share of the increase events, as they
are at the real rate.
"""

from __future__ import annotations

import heapq
import random
from collections import deque

from fabric.queue_counters import EcnSettings
from traffic.agent_config import FRAME_OVERHEAD_BYTES
from traffic.cc import CnpGate, Dcqcn, DcqcnSettings

PAYLOAD_BYTES = 4096
SEND, ARRIVE, CNP, HELD = 0, 1, 2, 3      # events: (t_ns, kind, sender)


def incast(senders: int = 8, message_bytes: int = 4_000_000, line_gbps: float = 40.0,
           ecn: EcnSettings | None = None, feedback_us: float = 4.0, seed: int = 1,
           settings: DcqcnSettings | None = None) -> dict:
    """JCT / ideal of `senders` flows of `message_bytes` into one port, and what DCQCN
    did (CNPs, the lowest rate, the peak queue); the switch marks as `ecn` says (the
    emulated switches' defaults when None)."""
    params = (settings or DcqcnSettings()).dcqcn_emulated(1.0)
    ecn = ecn or EcnSettings()
    kmin_bytes, kmax_bytes, pmax = ecn.ecn_kmin_bytes, ecn.ecn_kmax_bytes, ecn.ecn_pmax
    rng = random.Random(seed)
    frame = PAYLOAD_BYTES + FRAME_OVERHEAD_BYTES
    npackets = -(-message_bytes // PAYLOAD_BYTES)
    ns_per_byte = 8 / line_gbps                       # the bottleneck's (and the NICs')
    feedback_ns = int(feedback_us * 1e3)
    rps = [Dcqcn(line_gbps * 1e3, params) for _ in range(senders)]
    gates = [CnpGate(params["cnp_interval_ns"]) for _ in range(senders)]
    left = [npackets] * senders
    events: list[tuple[int, int, int]] = [(0, SEND, k) for k in range(senders)]
    departures: deque[int] = deque()                  # the queue: when each frame leaves
    free_at = peak = cnps = 0
    while events:
        now, kind, k = heapq.heappop(events)
        if kind == SEND:
            rp = rps[k]
            rp.tick(now)
            left[k] -= 1
            rp.on_sent(now, frame)
            while departures and departures[0] <= now:     # in order: one FIFO port
                departures.popleft()
            queued = len(departures) * frame
            peak = max(peak, queued)
            marked = queued >= kmax_bytes or (queued > kmin_bytes and rng.random() < pmax * (
                queued - kmin_bytes) / (kmax_bytes - kmin_bytes))
            free_at = max(now, free_at) + int(frame * ns_per_byte)
            departures.append(free_at)
            if marked:
                heapq.heappush(events, (free_at, ARRIVE, k))
            if left[k]:
                gap = frame * (rp.ns_per_byte if rp.active else ns_per_byte)
                heapq.heappush(events, (max(int(now + gap), rp.next_ns if rp.active else 0),
                                        SEND, k))
        elif kind == ARRIVE:
            gate = gates[k]
            if gate.on_ce(now):
                heapq.heappush(events, (now + feedback_ns, CNP, k))
                cnps += 1
            elif gate.held:
                heapq.heappush(events, (gate.last_ns + gate.interval_ns, HELD, k))
        elif kind == HELD:
            if gates[k].fire(now):
                heapq.heappush(events, (now + feedback_ns, CNP, k))
                cnps += 1
        else:
            rps[k].tick(now)
            rps[k].on_cnp(now)
    ideal_ns = senders * npackets * frame * ns_per_byte
    return {"jct_over_ideal": free_at / ideal_ns, "jct_us": free_at / 1e3,
            "ideal_us": ideal_ns / 1e3, "cnps": cnps, "peak_queue_bytes": peak,
            "lowest_rate_fraction": min(rp.lowest for rp in rps) / (line_gbps * 1e9),
            "line_gbps": line_gbps, "message_bytes": message_bytes, "senders": senders}
