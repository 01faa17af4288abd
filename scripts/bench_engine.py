#!/usr/bin/env python3
"""Micro-benchmark: the per-packet state machines and patcher, interpreted against compiled.

No network and no root: in child processes alternating AFT_ENGINE=interpreted and
compiled (traffic.engine), a synthetic workload of 16 flows sends --packets packets in
all through the transports (sender take/on_ack, receiver on_data/ack_fields, RTO timers;
a seeded 1 % of data packets lost, ACKs returned at once) for each transport, and a
data patcher (traffic.patch) writes --packets frames, and the agent's send-side objects
(entropy, patcher, port: sender_ns) carry --packets frames to a sink. Each prints its
time per packet, the best of REPEATS runs (the least disturbed by other load);
the parent prints the ratio interpreted / compiled per round (median, min-max) and
merges into results/bench.json:

    engine_transport_speedup (median; _min/_max), engine_patcher_speedup and
    engine_sender_speedup (likewise),
    engine_transport_ns_per_packet_{interpreted,compiled}, engine_patcher_ns_... (medians),
    engine_rounds

    python scripts/bench_engine.py [--packets 200000] [--rounds 3]

Ratios from one run, the engines alternated, are what to compare: absolute times on a
shared machine move with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FLOWS = 16
PAYLOAD_BYTES = 4096
LOSS = 0.01
SEED = 7
SEND_GAP_NS = 1_000
# the frames' addresses, from the testbed's own 198.18.0.0/15 (nothing is sent)
MACS_IPS = ("02:00:00:00:00:01", "02:00:00:00:00:02", "198.19.0.1", "198.19.0.2")
REPEATS = 5                  # each figure is the best of this many runs in its child
ENGINES = ("interpreted", "compiled")


def transport_ns(transport: str, packets: int) -> float:
    """ns per data packet sent (resends included) of the 16-flow workload."""
    from traffic.transport import NO_ACTION, make_receiver, make_sender
    from traffic.transport_settings import TransportParams
    params = TransportParams(window_packets=64, ack_every=8, rto_ms=0.2, reorder_threshold=8)
    n = max(1, packets // FLOWS)
    size = n * PAYLOAD_BYTES
    pairs = [(make_sender(transport, n, params),
              make_receiver(transport, size, PAYLOAD_BYTES, params)) for _ in range(FLOWS)]
    rng = random.Random(SEED)
    lost = [rng.random() < LOSS for _ in range(4096)]
    now = sent = k = 0
    live = list(pairs)
    t0 = time.perf_counter()
    while live:
        moved = False
        for tx, rx in live:
            psn = tx.take(now)
            if psn < 0:
                continue
            moved = True
            sent += 1
            now += SEND_GAP_NS
            k = (k + 1) & 4095
            if lost[k]:
                continue
            action = rx.on_data(psn, tx.ackreq(psn), now)
            if action != NO_ACTION:
                syndrome, bpsn, base, bitmap = rx.ack_fields(action)
                tx.on_ack(now, syndrome, bpsn & 0xFFFFFF, base & 0xFFFFFF, bitmap, base >> 24)
        if not moved:
            now += params.rto_ns
            for tx, rx in live:
                tx.on_timer(now)
                if rx.since_ack:
                    syndrome, bpsn, base, bitmap = rx.ack_fields(rx.delayed_ack())
                    tx.on_ack(now, syndrome, bpsn & 0xFFFFFF, base & 0xFFFFFF, bitmap,
                              base >> 24)
        live = [(tx, rx) for tx, rx in live if not tx.done]
    elapsed = time.perf_counter() - t0
    assert all(rx.exactly_once for _, rx in pairs)
    return elapsed * 1e9 / sent


def data_template():
    """The 4 KiB data frame both send-side measurements patch."""
    from traffic.packets import Addresses, Opcode, Template
    return Template.build(Opcode.RC_SEND_MIDDLE, Addresses(*MACS_IPS), dqpn=0x800012,
                          payload_bytes=PAYLOAD_BYTES)


def patcher_ns(packets: int) -> float:
    """ns per frame of a 4 KiB data template's patcher (16 buffers, one per flow)."""
    t = data_template()
    patches = [t.patcher(t.buffer()) for _ in range(FLOWS)]
    rounds = max(1, packets // FLOWS)
    t0 = time.perf_counter()
    for i in range(rounds):
        ts = 1_000_000 + i
        for f, patch in enumerate(patches):
            patch(i & 0xFFFFFF, 49152 + f, ts, f, (i * PAYLOAD_BYTES) & 0xFFFFFFFF)
    return (time.perf_counter() - t0) * 1e9 / (rounds * FLOWS)


def sender_ns(packets: int) -> float:
    """ns per data frame of the agent's per-frame objects on the send side, driven as its
    _pump drives them: a spraying flow's Entropy.port, its data patcher's write, and a
    non-blocking Port's push and wire clocks (16 flows on 2 ports; the port's socket is
    replaced by a sink, so no system call: no socket, no network)."""
    from traffic.entropy import Entropy
    from traffic.port import Port
    t = data_template()
    ports = []
    for _ in range(2):
        p = Port.__new__(Port)            # what Port() sets, without its packet socket
        p.ifname, p.blocking, p.send_frame, p.outq = "bench", False, len, lambda: 0
        p.direct = False                  # through send_frame (the sink), not send(2)
        p.pending, p.pending_ns, p.blocked, p.retry_ns = deque(), deque(), False, 0
        p.frames = p.eagain = p.enobufs = p.down_drops = 0
        p.ns_per_byte, p.free_at, p.drain_at = 0.08, 0, 0
        p.busy_ns, p.starved_ns, p.demand_since = 0.0, 0.0, 0
        p.wire, p.members, p.name = p, [p], "bench"     # its own wire's clocks
        ports.append(p)
    flows = []
    for f in range(FLOWS):
        buf = t.buffer()
        flows.append((Entropy("spray", SEED, f"flow{f}"), t.patcher(buf), buf, f))
    rounds = max(1, packets // FLOWS)
    now = 1_000_000
    t0 = time.perf_counter()
    for i in range(rounds):
        now += SEND_GAP_NS
        for ent, patch, buf, f in flows:
            sport = ent.port(now)
            patch.write(i & 0xFFFFFF, sport, now, f, (i * PAYLOAD_BYTES) & 0xFFFFFFFF)
            ports[sport & 1].push(buf, now, 0.0)
    return (time.perf_counter() - t0) * 1e9 / (rounds * FLOWS)


def child(packets: int) -> dict:
    from traffic.engine import engine
    def best(measure, *args) -> float:   # the least disturbed of REPEATS runs
        return min(measure(*args) for _ in range(REPEATS))

    return {"engine": engine(), "roce_ns": best(transport_ns, "roce", packets),
            "uet_ns": best(transport_ns, "uet", packets), "patcher_ns": best(patcher_ns, packets),
            "sender_ns": best(sender_ns, packets)}


def run_child(engine: str, packets: int) -> dict:
    env = {**os.environ, "AFT_ENGINE": engine}
    out = subprocess.run([sys.executable, __file__, "--child", "--packets", str(packets)],
                         cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    got = json.loads(out.stdout)
    if got["engine"] != engine:
        raise SystemExit(f"bench_engine: asked for {engine}, ran {got['engine']}")
    got["transport_ns"] = (got["roce_ns"] + got["uet_ns"]) / 2
    return got


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="bench.json to merge into (default: results/)")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.packets)))
        return 0
    from testbed.benchmarks import BENCH_JSON, machine_line, update_bench_json
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    ratios: dict[str, list[float]] = {"transport": [], "roce": [], "uet": [], "patcher": [],
                                      "sender": []}
    for r in range(args.rounds):
        got = {e: run_child(e, args.packets) for e in ENGINES}    # alternated, every round
        for e in ENGINES:
            runs[e].append(got[e])
        for key in ratios:
            ratios[key].append(got["interpreted"][f"{key}_ns"] / got["compiled"][f"{key}_ns"])
        print(f"round {r + 1}: " + ", ".join(
            f"{key} {got['interpreted'][f'{key}_ns']:.0f} / {got['compiled'][f'{key}_ns']:.0f}"
            f" ns = {ratios[key][-1]:.2f}x" for key in ratios))
    print(f"{args.packets} packets over {FLOWS} flows, {args.rounds} rounds, "
          f"interpreted / compiled, median (min-max):")
    for key in ratios:
        print(f"  {key:<9} {spread(ratios[key])}x  "
              f"({statistics.median(x[f'{key}_ns'] for x in runs['interpreted']):.0f} ns -> "
              f"{statistics.median(x[f'{key}_ns'] for x in runs['compiled']):.0f} ns per packet)")
    print(machine_line())
    record = {"engine_rounds": args.rounds}
    for key in ("transport", "patcher", "sender"):
        record[f"engine_{key}_speedup"] = round(statistics.median(ratios[key]), 3)
        record[f"engine_{key}_speedup_min"] = round(min(ratios[key]), 3)
        record[f"engine_{key}_speedup_max"] = round(max(ratios[key]), 3)
        for e in ENGINES:
            record[f"engine_{key}_ns_per_packet_{e}"] = round(
                statistics.median(x[f"{key}_ns"] for x in runs[e]), 1)
    update_bench_json(Path(args.out) if args.out else BENCH_JSON, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
