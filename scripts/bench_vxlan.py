#!/usr/bin/env python3
"""Benchmark: the CPU a packet costs crossing a VXLAN link, against a veth, in one run.

A fabric spread over several machines carries its cut links in VXLAN over the machines'
underlay (fabric.vxlan); every packet on such a link is encapsulated, sent through the
underlay's stack, received and decapsulated, where a veth hands it over in one step. Two
scratch namespaces joined by a veth underlay and a VXLAN link over it (fabric.vxlan.
scratch_pair); a UDP sender in one and a draining receiver in the other move --packets
datagrams of a RoCE packet's size (4,128 B of payload: a 4,156 B IP packet) over the
veth (to the underlay's address) and over the VXLAN link (to its port's address),
alternated --rounds times; the machine's busy CPU (every core: user, system, irq,
softirq) over each burst, per packet sent:

    vxlan_us = busy CPU / packets over VXLAN;  veth_us = the same over the veth
    cost of the encapsulation = vxlan_us - veth_us;  ratio = vxlan_us / veth_us

Both include the sender's and the receiver's Python per datagram, the same in both, so the
difference is VXLAN's own. Merges into results/bench.json: cluster_vxlan_us_per_packet
and cluster_veth_us_per_packet (medians, with _min/_max), cluster_vxlan_over_veth (the
ratio of the medians) and cluster_vxlan_extra_us_per_packet, with the machine's
calibration.

    sudo .venv/bin/python scripts/bench_vxlan.py [--packets 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabric import netns  # noqa: E402
from fabric.vxlan import INNER_ADDRESSES, UNDERLAY_ADDRESSES, scratch_pair  # noqa: E402
from testbed.benchmarks import machine_line, update_bench_json  # noqa: E402

LAB = "vxbench"
PORT = 4791
PAYLOAD_BYTES = 4128              # + UDP 8 + IP 20 = 4,156 B, a full RoCE packet
BURST = 256                       # datagrams sent before waiting for the receiver
SO_RCVBUFFORCE = 33
PATHS = {"veth": UNDERLAY_ADDRESSES[1], "vxlan": INNER_ADDRESSES[1]}


def busy_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq


def burst(tx: socket.socket, rx: socket.socket, dst: str, packets: int,
          timeout_s: float = 60.0) -> tuple[float, int]:
    """Send `packets` datagrams to `dst`, BURST at a time, each burst drained before the
    next; the busy CPU seconds it took and the datagrams received."""
    got = [0]
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            try:
                rx.recv(65536)
                got[0] += 1
            except TimeoutError:
                continue

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    data = bytes(PAYLOAD_BYTES)
    deadline = time.monotonic() + timeout_s
    t0 = busy_s()
    sent = 0
    while sent < packets and time.monotonic() < deadline:
        n = min(BURST, packets - sent)
        for _ in range(n):
            tx.sendto(data, (dst, PORT))
        sent += n
        while got[0] < sent - BURST // 4 and time.monotonic() < deadline:
            time.sleep(0.0005)
    while got[0] < sent and time.monotonic() < deadline:
        time.sleep(0.001)
    used = busy_s() - t0
    done.set()
    reader.join(timeout=2)
    return used, got[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=100_000,
                    help="datagrams per burst (the kernel counts CPU in 10 ms ticks: "
                         "100,000 resolve 0.1 us per packet)")
    ap.add_argument("--rounds", type=int, default=5, help="veth/VXLAN pairs, alternated")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    for name in ("packets", "rounds"):
        if getattr(args, name) < 1:
            print(f"bench_vxlan: --{name} must be at least 1", file=sys.stderr)
            return 2
    if netns.named(LAB):
        print(f"bench_vxlan: namespaces of lab {LAB} exist already (testbed clean)",
              file=sys.stderr)
        return 2
    print(f"# CPU per packet over a VXLAN link and over a veth, {args.packets} datagrams "
          f"of {PAYLOAD_BYTES} B each, alternated x{args.rounds}; {machine_line()}")
    per_packet: dict[str, list[float]] = {p: [] for p in PATHS}
    lost = {p: 0 for p in PATHS}
    with scratch_pair(LAB) as (ns_a, ns_b):
        with netns.entered(ns_b):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with netns.entered(ns_a):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with rx, tx:
            rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
            rx.bind(("0.0.0.0", PORT))
            rx.settimeout(0.2)
            for dst in PATHS.values():      # warm up: ARP, caches
                burst(tx, rx, dst, BURST)
            for r in range(args.rounds):
                for path, dst in PATHS.items():
                    used, got = burst(tx, rx, dst, args.packets)
                    per_packet[path].append(1e6 * used / args.packets)
                    lost[path] += args.packets - got
                    print(f"round {r + 1}/{args.rounds} {path:5}: "
                          f"{per_packet[path][-1]:.2f} us per packet, {got} received",
                          file=sys.stderr)
    med = {p: statistics.median(v) for p, v in per_packet.items()}
    if not med["veth"]:
        print(f"bench_vxlan: {args.packets} packets took too little CPU to measure (the "
              "kernel counts it in ticks): raise --packets", file=sys.stderr)
        return 1
    ratio = med["vxlan"] / med["veth"]
    print("| path | CPU us per packet (median, min-max) | not received |\n|---|---|---|")
    for p, v in per_packet.items():
        print(f"| {p} | {med[p]:.2f} ({min(v):.2f}-{max(v):.2f}) | {lost[p]} |")
    print(f"\nVXLAN costs {med['vxlan'] - med['veth']:.2f} us more per packet: "
          f"{ratio:.2f}x the veth's (the same run). Expected above 1: the packet crosses "
          "a second stack (the underlay's UDP) on each side, plus the encapsulation.")
    values = {"cluster_vxlan_over_veth": round(ratio, 3),
              "cluster_vxlan_extra_us_per_packet": round(med["vxlan"] - med["veth"], 3)}
    for p, v in per_packet.items():
        key = f"cluster_{p}_us_per_packet"
        values |= {key: round(med[p], 3), f"{key}_min": round(min(v), 3),
                   f"{key}_max": round(max(v), 3)}
    update_bench_json(args.out, values)
    return 0 if lost["vxlan"] + lost["veth"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
