"""Seeded scenarios that log every decision of the transports, DCQCN and the patchers.

tests/test_engine.py runs this in two processes, AFT_ENGINE=compiled and =interpreted,
and compares the logs: one source, two engines, the same decisions.

    python -m tests.engine_trace   (from the repository root) -> JSON on stdout

A scenario is a sender and a receiver joined by a fake network on a fake clock: a seeded
random.Random loses data packets (some UET ones trimmed instead), delays some (reorder),
marks some CE and loses ACKs; the run goes to completion through RTOs and delayed ACKs.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import sys

from traffic.cc import Dcqcn, DcqcnSettings
from traffic.engine import engine
from traffic.nscc import NsccSender, NsccSettings
from traffic.packets import Addresses, Opcode, Template, icrc_of, wire_icrc
from traffic.transport import NO_ACTION, make_receiver, make_sender
from traffic.transport_settings import TransportParams

PSN_MASK = 0xFFFFFF
SEEDS = (1, 2, 3)
LOSS_RATES = (0.0, 0.01, 0.1)
KINDS = ("roce", "uet", "nscc")
PACKETS, PAYLOAD = 400, 1024
SEND_GAP_NS = 1_000           # one packet's serialization
BASE_DELAY_NS = 20_000        # one way
REORDER_NS = 15_000           # the most a reordered packet is held back
MAX_EVENTS = 200_000
PARAMS = TransportParams(window_packets=32, ack_every=4, rto_ms=0.5, reorder_threshold=3,
                         ack_delay_us=60.0)


def _tx_counters(tx) -> dict:
    out = {k: getattr(tx, k) for k in ("packets", "retransmits", "naks", "acks", "timeouts",
                                       "una", "done")}
    if isinstance(tx, NsccSender):
        out.update(cwnd=repr(tx.cwnd), lowest=repr(tx.lowest), cuts=tx.cuts,
                   loss_cuts=tx.loss_cuts, ce_echoed=tx.ce_echoed,
                   base_rtt_ns=tx.base_rtt_ns, rtts=tx.rtts, limit=tx.limit)
    return out


def _rx_counters(rx) -> dict:
    return {k: getattr(rx, k) for k in (
        "packets", "ooo_packets", "dup_packets", "bad_packets", "double_deliveries",
        "max_reorder", "acks", "naks", "delivered_packets", "bytes_delivered", "complete",
        "trimmed", "exactly_once")}


def transport_run(kind: str, seed: int, loss: float) -> dict:
    """One message through the fake network; every decision logged."""
    rng = random.Random(f"{kind}/{seed}/{loss}")
    transport = "roce" if kind == "roce" else "uet"
    size = PACKETS * PAYLOAD - 321
    if kind == "nscc":
        nscc = NsccSettings(nscc_target_qdelay_us=10.0).nscc_emulated(1.0, ecn=True)
        tx = NsccSender(PACKETS, PARAMS, nscc)
    else:
        tx = make_sender(transport, PACKETS, PARAMS)
    rx = make_receiver(transport, size, PAYLOAD, PARAMS)
    log: list = []
    heap: list = []
    order = itertools.count()
    now = 0
    last_data = 0
    for _ in range(MAX_EVENTS):
        while True:                                  # send what the window allows
            psn = tx.take(now)
            if psn < 0:
                break
            log.append(["take", now, psn])
            r = rng.random()
            if r < loss:
                if transport == "uet" and rng.random() < 0.3:    # trimmed, not dropped
                    heapq.heappush(heap, (now + BASE_DELAY_NS, next(order), "trim", psn))
                continue
            late = rng.randrange(REORDER_NS) if rng.random() < 0.2 else 0
            ce = rng.random() < 0.05
            heapq.heappush(heap, (now + BASE_DELAY_NS + late, next(order), "data",
                                  (psn, tx.ackreq(psn), now, ce)))
            now += SEND_GAP_NS
        if tx.done and not heap:
            break
        due = [t for t in (heap[0][0] if heap else None, tx.deadline_ns(),
                           last_data + PARAMS.ack_delay_ns if rx.since_ack else None)
               if t is not None]
        if not due:
            break
        now = max(now, min(due))
        if heap and heap[0][0] <= now:
            _, _, what, item = heapq.heappop(heap)
            action = NO_ACTION
            if what == "data":
                psn, ackreq, ts, ce = item
                if ce:
                    rx.ce_marks += 1
                action = rx.on_data(psn, ackreq, ts)
                last_data = now
                log.append(["data", now, psn, action])
            elif what == "trim":
                action = rx.on_trimmed(item)
                log.append(["trim", now, item, action])
            else:
                syndrome, psn, base, bitmap = item
                tx.on_ack(now, syndrome, psn & PSN_MASK, base & PSN_MASK, bitmap, base >> 24)
                log.append(["on_ack", now, tx.una, tx.done, getattr(tx, "newly_acked", None),
                            repr(getattr(tx, "cwnd", None))])
            if action != NO_ACTION:
                _ack(rx, action, now, rng, loss, heap, order, log)
            continue
        fired = tx.on_timer(now)
        log.append(["timer", now, fired])
        if rx.since_ack and now >= last_data + PARAMS.ack_delay_ns:
            _ack(rx, rx.delayed_ack(), now, rng, loss, heap, order, log)
    return {"kind": kind, "seed": seed, "loss": loss, "log": log,
            "tx": _tx_counters(tx), "rx": _rx_counters(rx)}


def _ack(rx, action: int, now: int, rng: random.Random, loss: float, heap: list, order,
         log: list) -> None:
    fields = list(rx.ack_fields(action))
    log.append(["ack_fields", now, action, fields])
    if rng.random() >= loss:
        heapq.heappush(heap, (now + BASE_DELAY_NS, next(order), "ack", tuple(fields)))


def dcqcn_run(seed: int) -> dict:
    """A reaction point paced at its rate, CNPs at random, its timers ticked."""
    rng = random.Random(f"dcqcn/{seed}")
    params = DcqcnSettings().dcqcn_emulated(1.0)
    params["byte_counter_bytes"] = 200_000
    rp = Dcqcn(1000.0, params, burst_ns=5_000)
    log = []
    now = 0
    for _ in range(5_000):
        if rng.random() < 0.01:
            rp.on_cnp(now)
            log.append(["cnp", now])
        if not rp.active or rp.next_ns <= now:
            rp.on_sent(now, 4096)
        nxt = rp.tick(now)
        log.append([now, rp.active, repr(rp.rc), repr(rp.rt), repr(rp.alpha),
                    repr(rp.next_ns), nxt])
        now += rng.randrange(1_000, 40_000)
    return {"seed": seed, "log": log, "results": rp.results()}


def patcher_run(seed: int) -> dict:
    """Templates of each kind patched with the same seeded fields: the bytes, and whether
    each frame's ICRC is the one its bytes should carry."""
    rng = random.Random(f"patch/{seed}")
    where = Addresses("02:00:00:00:00:01", "02:00:00:00:00:02", "198.19.0.1", "198.19.0.2")
    data = [Template.build(Opcode.RC_SEND_MIDDLE, where, dqpn=0x12, payload_bytes=1024),
            Template.build(Opcode.RC_SEND_LAST, where, dqpn=0x800012, payload_bytes=100,
                           ackreq=True),
            Template.build(Opcode.RC_RDMA_WRITE_FIRST, where, dqpn=0x34, payload_bytes=512),
            Template.build(Opcode.RC_SEND_ONLY, where, dqpn=0x56, payload_bytes=256,
                           udp_checksum=True),
            Template.build(Opcode.CNP, where, dqpn=0x56, payload_bytes=16, becn=True)]
    acks = [Template.build(Opcode.RC_ACK, where, dqpn=0x12),
            Template.build(Opcode.RC_ACK, where, dqpn=0x800012, sack=True)]
    frames, valid = [], []
    for t in data:
        buf = t.buffer()
        patch = t.patcher(buf)
        for _ in range(50):
            patch(rng.randrange(1 << 24), rng.randrange(49152, 65536), rng.randrange(1 << 62),
                  rng.randrange(1 << 32), rng.randrange(1 << 32))
            frames.append(buf.hex())
            valid.append(icrc_of(buf) == wire_icrc(buf))
    for t in acks:
        buf = t.buffer()
        patch = t.ack_patcher(buf)
        for _ in range(50):
            patch(rng.randrange(1 << 24), rng.randrange(49152, 65536),
                  rng.choice((0x1F, 0x60)), rng.randrange(1 << 24), rng.randrange(1 << 32),
                  rng.randrange(1 << 64))
            frames.append(bytes(patch.buf).hex())
            valid.append(icrc_of(buf) == wire_icrc(buf))
    return {"seed": seed, "frames": frames, "icrc_valid": valid}


def trace() -> dict:
    return {"engine": engine(),
            "transports": [transport_run(k, s, p) for k in KINDS for s in SEEDS
                           for p in LOSS_RATES],
            "dcqcn": [dcqcn_run(s) for s in SEEDS],
            "patchers": [patcher_run(s) for s in SEEDS]}


if __name__ == "__main__":
    json.dump(trace(), sys.stdout)
