#!/usr/bin/env python3
"""Benchmark: raw AF_PACKET sender (patched template) vs scapy sendp, same packet, one run.

    cpu0 (198.19.0.1) ── cpu0-eth0 ═══ veth, HTB at 32 Gbit/s ═══ cpu1-eth0 ── cpu1 (198.19.0.2)
      senders: scapy sendp | Port.blast                         UDP socket on 4791 absorbs

What is measured: packets per second one core pushes into the sender's port. The
process is pinned to one CPU; the veth hands each frame to the receiving namespace in
the same CPU's softirq, so the receiver's kernel work is charged to that core too (as it
would be to a host sending through a real NIC driver, minus the DMA). The link is shaped
at 32 Gbit/s (HTB's most) instead of the fabric's usual 100 Mbit/s: a shaped class paces a raw
socket (send blocks), which would measure the shaper, not the sender. A UDP socket on
4791 in cpu1 absorbs the packets so the receiver sends no ICMP per packet.

  - scapy: `sendp(packet, iface, count=N)`: one socket, scapy builds every packet (its
    ICRC included); the fairest use of sendp. One `sendp` call per packet (a fresh
    socket each time) is shown too, for information.
  - raw:   `traffic.port.Port.blast` (a blocking port): per packet, PSN, send timestamp,
    byte offset and ICRC patched into a bytearray, then one send(2).

Rounds alternate scapy and raw; medians are compared. The ICRC of the frames sent in
the timed raw rounds is verified on a sample captured at the receiver (a BPF filter
keeps 1 frame in 64 by PSN, so the capture costs the timed run almost nothing).
Writes/updates results/bench.json (flat name -> number) and prints a table.

    sudo .venv/bin/python scripts/bench_sender.py [--rounds 3] [--payload-bytes 4096]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether
from scapy.sendrecv import sendp

from fabric import netns
from fabric.core import Fabric
from testbed.benchmarks import update_bench_json
from topologies import full_mesh
from topologies.spec import MAX_RATE_MBPS
from traffic.launch import addresses_between
from traffic.packets import (
    ROCE_MTU_BYTES,
    ROCE_UDP_PORT,
    Opcode,
    Template,
    icrc_of,
    wire_icrc,
)
from traffic.parse import parse
from traffic.port import Port

ROOT = Path(__file__).resolve().parent.parent

LAB = "bench-sender"      # our fabric's namespaces: aft-bench-sender.<node>
RATE_MBPS = MAX_RATE_MBPS  # the shaper never binds at these packet rates (~7 Gbit/s)
SAMPLE_EVERY = 64         # the BPF sample keeps PSNs that are multiples of this
SCAPY_CHECKS = 50         # sampled frames also checked against scapy's own ICRC
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
ETH_P_ALL = 0x0003


def sampling_filter(psn_word_offset: int) -> tuple[bytes, ctypes.Array]:
    """A classic BPF program: accept frames whose PSN is a multiple of SAMPLE_EVERY."""
    insns = [(0x20, 0, 0, psn_word_offset),      # ld  [psn word]
             (0x54, 0, 0, SAMPLE_EVERY - 1),     # and #SAMPLE_EVERY-1
             (0x15, 0, 1, 0),                    # jeq #0 ? accept : drop
             (0x06, 0, 0, 0x40000),              # ret #262144 (whole frame)
             (0x06, 0, 0, 0)]                    # ret #0
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in insns))
    prog = struct.pack("HL", len(insns), ctypes.addressof(code))
    return prog, code   # keep `code` alive while the kernel copies it


def open_sampler(namespace: str, ifname: str, psn_word_offset: int) -> socket.socket:
    with netns.entered(namespace):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        prog, _code = sampling_filter(psn_word_offset)
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
        sock.bind((ifname, ETH_P_ALL))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def drain(sock: socket.socket) -> list[bytes]:
    frames = []
    while True:
        try:
            frames.append(sock.recv(65536))
        except BlockingIOError:
            return frames


def roce_frames(frames: list[bytes]) -> list[bytes]:
    return [f for f in frames if len(f) > 40 and f[12:14] == b"\x08\x00" and f[23] == 17
            and struct.unpack_from(">H", f, 36)[0] == ROCE_UDP_PORT]


def scapy_round(template: Template, ifname: str, count: int) -> float:
    t0 = time.perf_counter()
    sendp(template.packet, iface=ifname, count=count, verbose=False)
    return count / (time.perf_counter() - t0)


def scapy_per_call(template: Template, ifname: str, count: int) -> float:
    t0 = time.perf_counter()
    for _ in range(count):
        sendp(template.packet, iface=ifname, verbose=False)
    return count / (time.perf_counter() - t0)



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each sender")
    ap.add_argument("--payload-bytes", type=int, default=ROCE_MTU_BYTES)
    ap.add_argument("--scapy-packets", type=int, default=1000, help="per scapy round")
    ap.add_argument("--raw-packets", type=int, default=300_000, help="per raw round")
    ap.add_argument("--per-call-packets", type=int, default=20,
                    help="one sendp call per packet, shown for information (0: skip)")
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the last)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_sender: needs root (it builds a fabric)", file=sys.stderr)
        return 2
    if netns.ours(LAB):
        print(f"bench_sender: leftovers of an earlier run ({netns.ours(LAB)[0]}): "
              "run 'testbed clean' first", file=sys.stderr)
        return 2

    scapy_pps: list[float] = []
    raw_pps: list[float] = []
    raw_gbps: list[float] = []
    sampled: list[bytes] = []
    dropped = 0
    per_call = 0.0
    cpu = max(os.sched_getaffinity(0)) if args.cpu is None else args.cpu
    saved_affinity = os.sched_getaffinity(0)
    fabric = Fabric(full_mesh(nodes=2, rate_mbps=RATE_MBPS), seed=1, lab=LAB).start()
    try:
        os.sched_setaffinity(0, {cpu})
        ifname, addr = addresses_between(fabric, "cpu0", "cpu1")
        rx_ifname = fabric.plan.port("cpu0", "cpu1").peer_ifname
        template = Template.build(Opcode.RC_SEND_ONLY, addr, dqpn=0x11,
                                  payload_bytes=args.payload_bytes)
        with netns.entered(fabric.ns("cpu1")):   # takes the packets: no ICMP per packet
            absorb = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        psn_word = template.bth + 8
        with absorb, Port(ifname, namespace=fabric.ns("cpu0"), blocking=True) as sender:
            absorb.bind((addr.dst_ip, ROCE_UDP_PORT))
            with netns.entered(fabric.ns("cpu0")):   # scapy opens its sockets here
                if args.per_call_packets:
                    per_call = scapy_per_call(template, ifname, args.per_call_packets)
                for r in range(args.rounds):
                    scapy_pps.append(scapy_round(template, ifname, args.scapy_packets))
                    with open_sampler(fabric.ns("cpu1"), rx_ifname, psn_word) as sampler:
                        report = sender.blast(template, args.raw_packets,
                                              psn=r * args.raw_packets)
                        time.sleep(0.05)
                        sampled += roce_frames(drain(sampler))
                    raw_pps.append(report.pps)
                    raw_gbps.append(report.gbps)
                    dropped += report.dropped
                    print(f"round {r + 1}/{args.rounds}: scapy sendp {scapy_pps[-1]:9.0f} pps, "
                          f"raw {report.pps:9.0f} pps ({report.gbps:.2f} Gbit/s), "
                          f"dropped {report.dropped}", flush=True)
    finally:
        fabric.stop()
        os.sched_setaffinity(0, saved_affinity)

    # Every sampled frame: our ICRC check; a spread of them also against scapy's.
    bad = [f for f in sampled if not parse(f)["icrc_ok"]]
    spread = sampled[::max(1, len(sampled) // SCAPY_CHECKS)]
    bad_scapy = [f for f in spread
                 if Ether(f)[BTH].compute_icrc(None) != struct.pack("<I", wire_icrc(f))
                 or icrc_of(f) != wire_icrc(f)]
    scapy_med, raw_med = statistics.median(scapy_pps), statistics.median(raw_pps)
    results = {
        "sender_pps_vs_scapy": round(raw_med / scapy_med, 1),
        "sender_pps": round(raw_med),
        "scapy_sendp_pps": round(scapy_med, 1),
        "scapy_sendp_per_call_pps": round(per_call, 1),
        "sender_gbps": round(statistics.median(raw_gbps), 3),
        "sender_payload_bytes": args.payload_bytes,
        "sender_icrc_sampled": len(sampled),
        "sender_icrc_bad": len(bad) + len(bad_scapy),
    }
    frame = len(template.frame)
    print(f"\n# sender benchmark: RC SEND ONLY, {args.payload_bytes} B payload, {frame} B frames,"
          f" 1 core (cpu {cpu}), median of {args.rounds} rounds")
    print(f"# {'sender':32s} {'packets':>9s} {'pps':>10s} {'Gbit/s':>8s}")
    rows = [("scapy sendp(count=N)", args.scapy_packets, scapy_med),
            ("raw AF_PACKET, patched template", args.raw_packets, raw_med)]
    if args.per_call_packets:
        rows.insert(0, ("scapy sendp, one call per packet", args.per_call_packets, per_call))
    for name, count, pps in rows:
        print(f"  {name:32s} {count:9d} {pps:10.0f} {pps * frame * 8 / 1e9:8.3f}")
    print(f"  ratio raw / scapy sendp(count=N): {results['sender_pps_vs_scapy']:.1f}x")
    print(f"  ICRC checked on {len(sampled)} frames captured from the timed raw rounds "
          f"({len(spread)} of them against scapy too): "
          f"{results['sender_icrc_bad']} bad; local drops {dropped}")
    update_bench_json(Path(args.out), results)
    print(f"recorded in {args.out}")
    if results["sender_icrc_bad"] or not sampled:
        print("bench_sender: ICRC check failed (bad or no sampled frames)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
