"""The wire layouts (fabric.wire): they agree with scapy's view of the same packets, the
eBPF programs' header fabric/bpf/wire.h is the one fabric.wire writes, and each C
struct the loader fills has a ctypes mirror with the same fields. No root needed."""

from __future__ import annotations

import ctypes
import importlib
import re
import struct
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from fabric import wire
from traffic.packets import RETH, Addresses, Template

BPF = Path(__file__).resolve().parent.parent / "fabric" / "bpf"
ADDR = Addresses("02:00:00:00:00:01", "02:00:00:00:00:02", "198.18.0.1", "198.18.0.2")
C_TYPES = {"__u32": ctypes.c_uint32, "__u64": ctypes.c_uint64}


def test_the_offsets_read_what_scapy_wrote():
    """A UET-style RDMA WRITE ONLY, built by scapy: each offset of fabric.wire finds the
    field scapy put there."""
    t = Template.build(wire.Opcode.RC_RDMA_WRITE_ONLY, ADDR, dqpn=wire.UET_QPN_FLAG | 5,
                       psn=0x123456, sport=50000, dscp=26, ecn=wire.ECN_ECT0, ackreq=True)
    f, pkt = t.frame, Ether(t.frame)
    assert struct.unpack_from("!H", f, wire.ETH_TYPE_AT)[0] == wire.ETHERTYPE_IPV4
    assert f[wire.IP_AT] == wire.IP_VERSION_IHL
    assert f[wire.IP_TOS_AT] == pkt[IP].tos == 26 << wire.DSCP_SHIFT | wire.ECN_ECT0
    assert struct.unpack_from("!H", f, wire.IP_LEN_AT)[0] == pkt[IP].len
    assert f[wire.IP_TTL_AT] == pkt[IP].ttl and f[wire.IP_PROTO_AT] == wire.IP_PROTO_UDP
    assert struct.unpack_from("!H", f, wire.IP_CSUM_AT)[0] == pkt[IP].chksum
    assert f[wire.IP_SRC_AT:wire.IP_SRC_AT + 4] == bytes([198, 18, 0, 1])
    assert f[wire.IP_DST_AT:wire.IP_DST_AT + 4] == bytes([198, 18, 0, 2])
    assert (t.udp, t.bth) == (wire.UDP_AT, wire.BTH_AT)
    assert struct.unpack_from("!H", f, wire.UDP_DPORT_AT)[0] == pkt[UDP].dport
    assert struct.unpack_from("!H", f, wire.UDP_LEN_AT)[0] == pkt[UDP].len
    assert struct.unpack_from("!H", f, wire.UDP_CSUM_AT)[0] == pkt[UDP].chksum
    assert f[wire.BTH_OPCODE_AT] == pkt[BTH].opcode
    assert f[wire.BTH_DQPN_AT] & wire.UET_QPN_FLAG_BYTE
    assert int.from_bytes(f[wire.BTH_DQPN_AT:wire.BTH_DQPN_AT + 3]) == pkt[BTH].dqpn
    psn_word = struct.unpack_from("!I", f, wire.BTH_PSN_AT)[0]
    assert psn_word & wire.PSN_MASK == pkt[BTH].psn and psn_word & wire.ACKREQ_BIT
    assert t.ext == wire.BTH_AT + wire.BTH_BYTES             # scapy's RETH follows the BTH
    assert struct.unpack_from("!I", f, t.ext + 12)[0] == pkt[RETH].dma_len == 4096
    assert t.payload - t.ext == wire.RETH_BYTES and t.icrc == len(f) - wire.ICRC_BYTES
    assert wire.DATA_OPCODE_MAX == wire.Opcode.RC_RDMA_WRITE_ONLY


def test_the_trimmed_frame_is_headers_and_the_stamp():
    assert wire.TRIMMED_FRAME_BYTES == wire.BTH_AT + wire.BTH_BYTES + wire.STAMP_BYTES == 70


def test_pfc_frame_round_trip_and_refusals():
    frame = wire.pfc_frame("02:00:00:00:00:0a", {3: 0xFFFF, 5: 0})
    assert len(frame) == wire.PFC_FRAME_BYTES
    assert wire.parse_pfc_frame(frame) == {"src": "02:00:00:00:00:0a", "enable_vector": 0x28,
                                           "pause_quanta": [0, 0, 0, 0xFFFF, 0, 0, 0, 0]}
    assert (wire.pause_quanta(frame, 3), wire.pause_quanta(frame, 5)) == (0xFFFF, 0)
    assert wire.pause_quanta(frame, 4) is None
    assert wire.quanta_s(0xFFFF, 100.0) == pytest.approx(0xFFFF * 512 / 100e6)
    for pause in ({-1: 1}, {8: 1}, {0: 0x10000}, {0: -1}):
        with pytest.raises(ValueError):
            wire.pfc_frame("02:00:00:00:00:0a", pause)
    with pytest.raises(ValueError, match="6 bytes"):
        wire.pfc_frame("02:00:00:00:0a", {0: 1})


def test_the_committed_header_is_the_one_fabric_wire_writes():
    """scripts/build_bpf.py writes it; run it after editing fabric/wire.py."""
    assert (BPF / "wire.h").read_text() == wire.c_header(), "run: python3 scripts/build_bpf.py"


def c_defines(text: str) -> dict[str, int]:
    return {m[1]: int(m[2], 0) for m in re.finditer(r"^#define (\w+) (\w+)", text, re.M)}


def c_struct(text: str, head: str) -> list[tuple[str, type, int]]:
    """(name, ctypes type, count) of each field of the struct that opens with `head`."""
    body = text[text.index(head) + len(head):]
    body = re.sub(r"/\*.*?\*/", "", body[:body.index("}")], flags=re.S)
    fields = []
    for ctype, names in re.findall(r"(__u\d+)\s+([^;]+);", body):
        for name in names.split(","):
            m = re.fullmatch(r"\s*(\w+)(?:\[(\w+)\])?\s*", name)
            count = 1 if m[2] is None else c_defines(text).get(m[2]) or int(m[2])
            fields.append((m[1], C_TYPES[ctype], count))
    return fields


def mirror(structure: type[ctypes.Structure]) -> list[tuple[str, type, int]]:
    out = []
    for name, ctype in structure._fields_:
        if issubclass(ctype, ctypes.Array):
            out.append((name, ctype._type_, ctype._length_))
        else:
            out.append((name, ctype, 1))
    return out


def test_the_header_says_what_fabric_wire_says():
    header = (BPF / "wire.h").read_text()
    defines = c_defines(header)
    assert defines == {name: getattr(wire, name) for name in wire.C_DEFINES}
    assert c_struct(header, "struct count {") == mirror(wire.Count)
    assert ctypes.sizeof(wire.Count) == wire.COUNT.size


@pytest.mark.parametrize("name, config", [
    ("queue", "fabric.queue_counters.HookConfig"),
    ("switch_lb", "fabric.switch_lb.LbConfig"),
    ("shaping_timers", "fabric.shaping_timers.TimersConfig")])
def test_each_programs_cfg_has_its_mirrors_fields(name, config):
    """The loader writes a ctypes Structure over the object's `cfg`: the same fields, in
    the same order, of the same types (the size alone would miss two swapped fields)."""
    text = (BPF / f"{name}.bpf.c").read_text()
    module, cls = config.rsplit(".", 1)
    assert c_struct(text, "const volatile struct {") == mirror(
        getattr(importlib.import_module(module), cls))


@pytest.mark.parametrize("name", ["queue", "switch_lb"])
def test_the_programs_that_share_the_counters_take_struct_count_from_the_header(name):
    text = (BPF / f"{name}.bpf.c").read_text()
    assert '#include "wire.h"' in text and "struct count {" not in text
