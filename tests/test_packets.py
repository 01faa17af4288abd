"""Tests for traffic.packets and traffic.port (the blocking sender).

Known answers pinned from scapy.contrib.roce, the patcher against scapy's ICRC on random
packets, parse() round trips; as root, frames sent through a 2-node fabric, captured with
tcpdump, decoded by tshark and re-verified with scapy.
"""

from __future__ import annotations

import os
import random
import select
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from traffic import packets
from traffic.packets import (
    ROCE_UDP_PORT,
    Addresses,
    Opcode,
    Syndrome,
    Template,
    icrc_of,
    transport_of,
    udp_checksum_of,
    wire_icrc,
)
from traffic.parse import parse

ADDR = Addresses("02:00:00:00:00:01", "02:00:00:00:00:02", "198.19.0.1", "198.19.0.2")
BACK = Addresses("02:00:00:00:00:02", "02:00:00:00:00:01", "198.19.0.2", "198.19.0.1")

# Ether/IP(tos=26<<2|2, DF, id 0)/UDP(0xC000 -> 4791, chksum 0)/BTH(SEND_ONLY, dqpn 0x11,
# psn 0x123456, ackreq)/bytes(range(64))/ICRC, as scapy builds it.
KAT_FRAME = bytes.fromhex(
    "020000000002020000000001080045" "6a006c000040004011adedc6130001c6130002c00012b70058"
    "00000400ffff0000001180123456" + bytes(range(64)).hex() + "96c3c343")
KAT_ICRC = 0x43C3C396                 # on the wire little-endian: 96 c3 c3 43
# The same packet patched: psn 0xABCDEF, sport 0xD00D, stamp (0x1122334455667788,
# 0xCAFEBABE, 0x1000); ICRC and UDP checksum as scapy computes them.
KAT_PATCHED_ICRC = 0x54F8C105
KAT_PATCHED_UDP_CHECKSUM = 0xECB6
# RC ACK, dqpn 0x22, psn 0x100, AETH(ACK 0x1f, msn 7), back from 198.19.0.2.
KAT_ACK_ICRC = 0x34475E14

DATA_OPCODES = (Opcode.RC_SEND_FIRST, Opcode.RC_SEND_MIDDLE, Opcode.RC_SEND_LAST,
                Opcode.RC_SEND_ONLY, Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_MIDDLE,
                Opcode.RC_RDMA_WRITE_LAST, Opcode.RC_RDMA_WRITE_ONLY)


def kat_template(udp_checksum: bool = False) -> Template:
    return Template.build(Opcode.RC_SEND_ONLY, ADDR, dqpn=0x11, psn=0x123456, sport=0xC000,
                          ackreq=True, payload=bytes(range(64)), udp_checksum=udp_checksum)


def scapy_icrc(frame: bytes | bytearray) -> int:
    """The ICRC scapy.contrib.roce computes for a frame (independent of our code)."""
    return struct.unpack("<I", Ether(bytes(frame))[BTH].compute_icrc(None))[0]


def scapy_checksums(frame: bytes | bytearray) -> tuple[int, int, int, int]:
    """(IP checksum carried, as scapy recomputes it, UDP checksum carried, recomputed)."""
    pkt = Ether(bytes(frame))
    ip_ck, udp_ck = pkt[IP].chksum, pkt[UDP].chksum
    del pkt[IP].chksum
    del pkt[UDP].chksum
    again = Ether(bytes(pkt))
    return ip_ck, again[IP].chksum, udp_ck, again[UDP].chksum


# -- known answers ----------------------------------------------------------------------
def test_template_is_the_scapy_packet_with_the_pinned_icrc():
    t = kat_template()
    assert t.frame == KAT_FRAME
    assert wire_icrc(t.frame) == KAT_ICRC == icrc_of(t.frame)
    assert (t.udp, t.bth, t.ext, t.payload, t.stamp, t.icrc) == (34, 42, None, 54, 54, 118)


def test_patching_the_values_already_there_reproduces_the_frame():
    t = kat_template()
    buf = t.buffer()
    buf[t.icrc:] = b"\0\0\0\0"
    t.patch(buf, 0x123456, 0xC000, 0x0001020304050607, 0x08090A0B, 0x0C0D0E0F)
    assert bytes(buf) == KAT_FRAME


@pytest.mark.parametrize("udp_checksum", [False, True])
def test_patched_packet_known_answer(udp_checksum):
    t = kat_template(udp_checksum)
    buf = t.patch(t.buffer(), 0xABCDEF, 0xD00D, 0x1122334455667788, 0xCAFEBABE, 0x1000)
    assert wire_icrc(buf) == KAT_PATCHED_ICRC
    want_ck = KAT_PATCHED_UDP_CHECKSUM if udp_checksum else 0
    assert struct.unpack_from(">H", buf, t.udp + 6)[0] == want_ck


def test_ack_known_answer():
    t = Template.build(Opcode.RC_ACK, BACK, dqpn=0x22, psn=0x100, sport=0xC000,
                       syndrome=Syndrome.ACK, msn=7)
    assert wire_icrc(t.frame) == KAT_ACK_ICRC == scapy_icrc(t.frame)
    buf = t.patch_ack(t.buffer(), 0x100, 0xC000, Syndrome.ACK, 7)
    assert bytes(buf) == t.frame


# -- the patcher against scapy ------------------------------------------------------------
@pytest.mark.parametrize("udp_checksum", [False, True])
def test_patched_icrc_and_checksums_equal_scapy_on_random_packets(udp_checksum):
    rng = random.Random(4791 + udp_checksum)
    for _ in range(60):
        opcode = rng.choice(DATA_OPCODES)
        size = rng.choice([0, 1, 3, 15, 16, 17, 64, 255, 1024, 4096, rng.randrange(8192)])
        t = Template.build(opcode, ADDR, dqpn=rng.randrange(1 << 24), payload_bytes=size,
                           dscp=rng.randrange(64), ecn=rng.randrange(4), ackreq=rng.random() < .5,
                           ttl=rng.randrange(1, 256), udp_checksum=udp_checksum,
                           va=rng.getrandbits(64), rkey=rng.getrandbits(32))
        buf = t.buffer()
        patch = t.patcher(buf)
        for _ in range(4):
            fields = (rng.randrange(1 << 24), rng.randrange(1 << 16), rng.getrandbits(64),
                      rng.getrandbits(32), rng.getrandbits(32))
            patch(*fields)
            assert wire_icrc(buf) == scapy_icrc(buf) == icrc_of(buf), (opcode, size, fields)
            ip_ck, ip_want, udp_ck, udp_want = scapy_checksums(buf)
            assert ip_ck == ip_want
            assert udp_ck == (udp_want if udp_checksum else 0)
            assert udp_checksum_of(buf) == udp_want


def test_masked_fields_do_not_change_the_icrc():
    """What a switch rewrites (TTL, ECN, DSCP, IP checksum, FECN/BECN) leaves the ICRC valid."""
    t = Template.build(Opcode.RC_RDMA_WRITE_MIDDLE, ADDR, dqpn=5, payload_bytes=256)
    buf = t.patch(t.buffer(), 9, 50000, 1, 2, 3)
    before = icrc_of(buf)
    buf[t.ip + 1] |= packets.ECN_CE
    buf[t.ip + 8] -= 3
    buf[t.ip + 10:t.ip + 12] = b"\x12\x34"
    buf[t.udp + 6:t.udp + 8] = b"\xab\xcd"
    buf[t.bth + 4] = 0xC0
    assert icrc_of(buf) == before == scapy_icrc(buf)
    buf[t.bth + 11] ^= 1               # the PSN is covered
    assert icrc_of(buf) != before


# -- parse --------------------------------------------------------------------------------
@pytest.mark.parametrize("opcode", DATA_OPCODES)
def test_parse_round_trip(opcode):
    t = Template.build(opcode, ADDR, dqpn=0x812345, payload_bytes=1021, dscp=26, va=0x1000,
                       rkey=0xBEEF, dma_len=65536)
    buf = t.patch(t.buffer(), 0xFFFFFF, 0xC123, 123456789, 42, 8192)
    got = parse(buf)
    assert got["icrc_ok"]
    assert (got["opcode"], got["dqpn"], got["psn"], got["sport"], got["dport"]) == (
        opcode, 0x812345, 0xFFFFFF, 0xC123, ROCE_UDP_PORT)
    assert (got["ts_ns"], got["msg_id"], got["offset"]) == (123456789, 42, 8192)
    assert (got["payload_bytes"], got["padcount"]) == (1021, 3)
    assert (got["src"], got["dst"], got["dscp"], got["ecn"]) == (
        "198.19.0.1", "198.19.0.2", 26, packets.DEFAULT_ECN)
    if opcode in packets.RETH_OPCODES:
        assert (got["va"], got["rkey"], got["dma_len"]) == (0x1000, 0xBEEF, 65536)
    assert transport_of(got["dqpn"]) is packets.Transport.UET
    buf[-20] ^= 0xFF
    assert not parse(buf)["icrc_ok"]


def test_parse_ack_and_sack():
    t = Template.build(Opcode.RC_ACK, BACK, dqpn=0x22, sack=True)
    buf = t.patch_ack(t.buffer(), 77, 0xC001, Syndrome.NAK_PSN_SEQ_ERROR, 9, 70, 0xF0F0)
    got = parse(buf)
    assert got["icrc_ok"] and scapy_icrc(buf) == got["icrc"]
    assert (got["opcode"], got["psn"], got["syndrome"], got["msn"], got["ts_ns"]) == (
        Opcode.RC_ACK, 77, Syndrome.NAK_PSN_SEQ_ERROR, 9, None)
    sack = Ether(bytes(buf))[packets.SACK]
    assert (sack.base_psn, sack.bitmap) == (70, 0xF0F0)


def test_parse_ignores_ethernet_padding_and_rejects_other_traffic():
    t = Template.build(Opcode.RC_ACK, BACK, dqpn=1)
    assert parse(bytes(t.frame) + bytes(8))["icrc_ok"]
    other = bytearray(t.frame)
    other[t.udp + 2:t.udp + 4] = struct.pack(">H", 53)
    with pytest.raises(ValueError, match="4791"):
        parse(other)
    with pytest.raises(ValueError):
        parse(b"\0" * 30)


def test_build_rejects_bad_fields():
    with pytest.raises(ValueError, match="psn"):
        Template.build(Opcode.RC_SEND_ONLY, ADDR, dqpn=1, psn=1 << 24)
    with pytest.raises(ValueError, match="dscp"):
        Template.build(Opcode.RC_SEND_ONLY, ADDR, dqpn=1, dscp=64)
    with pytest.raises(ValueError, match="ACK"):
        Template.build(Opcode.RC_ACK, ADDR, dqpn=1, payload_bytes=16)
    with pytest.raises(ValueError, match="MTU"):
        Template.build(Opcode.RC_RDMA_WRITE_ONLY, ADDR, dqpn=1, payload_bytes=8960)
    ack = Template.build(Opcode.RC_ACK, ADDR, dqpn=1)
    with pytest.raises(ValueError, match="patch_ack"):
        ack.patcher(ack.buffer())
    data = Template.build(Opcode.RC_SEND_ONLY, ADDR, dqpn=1)
    with pytest.raises(ValueError, match="buffer"):
        data.patcher(bytearray(10))


def test_default_packet_is_roce_mtu_in_the_lossless_class():
    t = Template.build(Opcode.RC_SEND_ONLY, ADDR, dqpn=1)
    got = parse(t.frame)
    assert got["payload_bytes"] == packets.ROCE_MTU_BYTES == 4096
    assert (got["dscp"], got["ecn"]) == (packets.DEFAULT_DSCP, packets.ECN_ECT0)
    assert len(t.frame) == 14 + 20 + 8 + 12 + 4096 + 4


# -- on the wire (root) -------------------------------------------------------------------
TSHARK_FIELDS = ["infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
                 "ip.checksum.status", "udp.checksum.status"]
SO_RCVBUFFORCE = 33   # <asm-generic/socket.h>; Python's socket module lacks it


def wait_for_line(stream, needle: str, timeout_s: float) -> str:
    """Read a process's pipe until `needle` shows up (tcpdump's "listening on")."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            raise TimeoutError(f"no {needle!r} within {timeout_s} s; got {seen!r}")
        chunk = os.read(stream.fileno(), 4096).decode(errors="replace")
        if not chunk:
            raise EOFError(f"stream closed before {needle!r}; got {seen!r}")
        seen += chunk
    return seen


def frames_to_send(addr: Addresses) -> tuple[list[bytes], list[tuple[int, int, int]]]:
    """A 24-packet RDMA WRITE, 25 UET-style SENDs (PSN wrapping, UDP checksum on), a NAK;
    and the (opcode, dqpn, psn) of each."""
    frames, sent = [], []
    first, middle, last = (Template.build(op, addr, dqpn=0x000123, payload_bytes=4096)
                           for op in (Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_MIDDLE,
                                      Opcode.RC_RDMA_WRITE_LAST))
    for i in range(24):
        t = first if i == 0 else last if i == 23 else middle
        frames.append(bytes(t.patch(t.buffer(), 1000 + i, 0xC000 + i, packets.now_ns(), 1,
                                    i * 4096)))
        sent.append((t.opcode, 0x000123, 1000 + i))
    send = Template.build(Opcode.RC_SEND_ONLY, addr, dqpn=0x800456, payload_bytes=1000,
                          udp_checksum=True)
    for i in range(25):
        psn = (0xFFFFF0 + i) & packets.PSN_MASK
        frames.append(bytes(send.patch(send.buffer(), psn, 0xD000 + i, packets.now_ns(),
                                       2 + i, 0)))
        sent.append((send.opcode, 0x800456, psn))
    ack = Template.build(Opcode.RC_ACK, addr, dqpn=0x000789, udp_checksum=True)
    frames.append(bytes(ack.patch_ack(ack.buffer(), 1023, 0xC000,
                                      Syndrome.NAK_PSN_SEQ_ERROR, 3)))
    sent.append((ack.opcode, 0x000789, 1023))
    return frames, sent


@pytest.mark.root
def test_frames_on_the_wire_decode_in_tshark_and_verify_in_scapy(fabric, tmp_path: Path):
    from topologies import full_mesh
    from traffic.launch import addresses_between
    from traffic.port import Port

    from .conftest import udp_socket_in

    fab = fabric(full_mesh(nodes=2))
    pcap = tmp_path / "roce.pcap"
    ifname, addr = addresses_between(fab, "cpu0", "cpu1")
    frames, sent = frames_to_send(addr)
    rx = udp_socket_in(fab, "cpu1")      # takes the datagrams: no ICMP port unreachable
    rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    rx.bind((addr.dst_ip, ROCE_UDP_PORT))
    rx.settimeout(5.0)
    dump = fab.popen("cpu1", ["tcpdump", "-i", fab.plan.port("cpu0", "cpu1").peer_ifname,
                              "-w", str(pcap), "-U", "-n", "-Z", "root",
                              "udp", "port", str(ROCE_UDP_PORT)])
    try:
        wait_for_line(dump.stderr, "listening on", 10.0)
        with Port(ifname, namespace=fab.ns("cpu0"), blocking=True) as sender:
            report = sender.send(frames)
        assert (report.packets, report.dropped) == (len(frames), 0)
        # The receiving kernel checks IP and UDP checksums before a socket sees a datagram.
        for _ in frames:
            rx.recv(16384)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and len(rdpcap(str(pcap))) < len(frames):
            time.sleep(0.1)
    finally:
        dump.terminate()             # SIGTERM: tcpdump flushes the file and prints counts
        dump.wait(timeout=10)
        rx.close()
    stats = dump.stderr.read().decode(errors="replace")

    out = subprocess.run(["tshark", "-r", str(pcap), "-d", f"udp.port=={ROCE_UDP_PORT},infiniband",
                          "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
                          "-T", "fields", "-E", "separator=,",
                          *[arg for f in TSHARK_FIELDS for arg in ("-e", f)]],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    rows = [line.split(",") for line in out.splitlines() if line]
    assert len(rows) == len(frames), f"tshark read {len(rows)} frames; tcpdump: {stats}"
    assert [(int(op), int(qp, 16), int(psn)) for op, qp, psn, _, _ in rows] == sent
    assert all(ip_status == "1" for *_, ip_status, _ in rows)          # 1: good
    assert all(udp_status in ("1", "3") for *_, udp_status in rows)    # good, or absent (0)

    captured = [bytes(p) for p in rdpcap(str(pcap))]
    assert captured == frames, stats
    for frame in captured:
        assert wire_icrc(frame) == scapy_icrc(frame) == icrc_of(frame)
        ip_ck, ip_want, udp_ck, udp_want = scapy_checksums(frame)
        assert ip_ck == ip_want
        assert udp_ck in (0, udp_want)
        assert parse(frame)["icrc_ok"]


@pytest.mark.root
def test_blast_numbers_stamps_and_sprays(fabric):
    """blast(): consecutive PSNs from the start value (wrapping), entropy cycled per packet,
    stamps in send order; the receiving kernel hands over every datagram."""
    from topologies import full_mesh
    from traffic.launch import addresses_between
    from traffic.port import Port

    from .conftest import udp_socket_in

    fab = fabric(full_mesh(nodes=2))
    ifname, addr = addresses_between(fab, "cpu0", "cpu1")
    template = Template.build(Opcode.RC_RDMA_WRITE_MIDDLE, addr, dqpn=0x800001,
                              payload_bytes=512)
    entropies = [0xC000, 0xC001, 0xE000, 0xFFFF]
    with udp_socket_in(fab, "cpu1") as rx:
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        rx.bind((addr.dst_ip, ROCE_UDP_PORT))
        rx.settimeout(5.0)
        before = packets.now_ns()
        with Port(ifname, namespace=fab.ns("cpu0"), blocking=True) as sender:
            report = sender.blast(template, 40, psn=0xFFFFEC, entropies=entropies, msg_id=9)
        assert (report.packets, report.dropped) == (40, 0)
        assert report.bytes == 40 * len(template.frame) and report.pps > 0
        got = [rx.recvfrom(4096) for _ in range(40)]
    sports = [source[1] for _, source in got]
    psns = [int.from_bytes(data[9:12], "big") for data, _ in got]
    stamps = [packets.STAMP.unpack_from(data, 12) for data, _ in got]
    assert sports == [entropies[i % 4] for i in range(40)]
    assert psns == [(0xFFFFEC + i) & packets.PSN_MASK for i in range(40)]
    assert [(m, o) for _, m, o in stamps] == [(9, i * 512) for i in range(40)]
    times = [ts for ts, _, _ in stamps]
    assert before <= times[0] and times == sorted(times) and times[-1] <= packets.now_ns()


@pytest.mark.root
def test_bench_sender_script_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import importlib.util
    import json

    from fabric import netns
    from fabric.clean import leftovers

    from .conftest import LAB

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_sender.py"
    spec = importlib.util.spec_from_file_location("bench_sender", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "LAB", LAB)      # this test run's lab, beside anything else
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"fabric_build_vs_mininet": 1.5}))
    assert bench.main(["--rounds", "1", "--scapy-packets", "20", "--raw-packets", "6400",
                       "--per-call-packets", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["fabric_build_vs_mininet"] == 1.5          # merged, not overwritten
    assert data["sender_pps"] > data["scapy_sendp_pps"] > 0
    assert data["sender_pps_vs_scapy"] > 1
    assert data["sender_icrc_sampled"] == 6400 // bench.SAMPLE_EVERY
    assert data["sender_icrc_bad"] == 0
    assert netns.ours(LAB) == [] and leftovers(LAB) == 0


@pytest.mark.parametrize("sack", [False, True])
@pytest.mark.parametrize("udp_checksum", [False, True])
def test_ack_patcher_writes_the_same_bytes_as_patch_ack(sack, udp_checksum):
    t = Template.build(Opcode.RC_ACK, BACK, dqpn=0x22, dscp=26, sack=sack,
                       udp_checksum=udp_checksum)
    slow, fast = t.buffer(), t.buffer()
    patch = t.ack_patcher(fast)
    rng = random.Random(7)
    for _ in range(500):
        args = (rng.randrange(1 << 24), rng.randrange(0xC000, 0x10000),
                rng.choice([0x00, 0x1F, 0x60]), rng.randrange(1 << 24),
                rng.randrange(1 << 24), rng.randrange(1 << 64))
        t.patch_ack(slow, *args)
        patch(*args)
        assert fast == slow
        assert wire_icrc(fast) == icrc_of(fast)
    assert patch.buf is fast
