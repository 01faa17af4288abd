"""The wire layouts the testbed builds, patches and reads: RoCEv2 and its UET-style flows,
the trimmed frame, the 802.1Qbb PFC frame, the VOQ control frame, and the counters the eBPF
programs share.

Pure Python, no scapy: traffic.packets builds its templates from these sizes and
opcodes, fabric.trimming checks a trimmed frame by them, the switch controller builds
its pause frames with `pfc_frame`, and fabric/bpf/wire.h is written from this module
(`c_header`, scripts/build_bpf.py; tests/test_queue_counters.py checks it is current).

    RoCEv2 (IPv4 without options; offsets from the start of the Ethernet frame):

      0  Ether dst | src | type 0x0800                                   ETH_BYTES 14
     14  IPv4  TOS (DSCP << 2 | ECN) at 15, total length 16, TTL 22,
                protocol 17 (UDP) at 23, checksum 24, src 26, dst 30     IPV4_BYTES 20
     34  UDP   sport (entropy) | dport 4791 at 36 | length 38 | checksum 40  UDP_BYTES 8
     42  BTH   opcode | flags | pkey | resv8a (FECN, BECN) at 46 |
                dQPN at 47 (bit 23: a UET-style flow) | ackreq + PSN at 50   BTH_BYTES 12
     54  [RETH 16 (RDMA WRITE FIRST/ONLY) | AETH 4 (ACK) [+ SACK 12]]
         payload (the 16-byte stamp at its head) | ICRC 4 (little-endian)

UET-style flows use the same UDP port (4791) and the RC opcodes; a destination QP with
bit 23 set tells them apart. A trimmed UET data frame keeps Ethernet, IPv4, UDP, the
BTH and the stamp (TRIMMED_FRAME_BYTES, 70) and carries DSCP TRIM_DSCP.

    PFC (802.1Qbb), 60 bytes as a socket sends it (64 with the FCS):

      0  Ether dst 01:80:C2:00:00:01 | src | type 0x8808
     14  MAC control opcode 0x0101 | class-enable vector (bit p = priority p)
     18  pause time c0 .. c7, 16 bits each, in quanta of 512 bit times (0 = resume)
     34  zero pad to 60

    VOQ control (the testbed's per-destination pause and credit grant), 60 bytes:

      0  Ether dst 01:80:C2:00:00:01 | src | type 0x88B6 (IEEE 802 local experimental 2)
     14  version 1 | opcode (1 pause, 2 credit) | priority | reserved
     18  destination IPv4 (the fabric egress the held queue feeds)
     22  pause quanta (0 = release) | reserved 16
     26  credit 32 (bytes a second) | sequence number 32 (per sending port, wraps)
     34  zero pad to 60

fabric/wireshark/aft_voq.lua decodes the VOQ frame in tshark and Wireshark
(`tshark_lua_args`).
"""

from __future__ import annotations

import ctypes
import ipaddress
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

# -- Ethernet ---------------------------------------------------------------------------
ETH_BYTES = 14
ETH_TYPE_AT = 12
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_MAC_CONTROL = 0x8808

# -- IPv4 (no options) ------------------------------------------------------------------
IPV4_BYTES = 20
IP_AT = ETH_BYTES
IP_TOS_AT = IP_AT + 1               # DSCP << 2 | ECN
IP_LEN_AT = IP_AT + 2
IP_TTL_AT = IP_AT + 8
IP_PROTO_AT = IP_AT + 9
IP_CSUM_AT = IP_AT + 10
IP_SRC_AT = IP_AT + 12
IP_DST_AT = IP_AT + 16
IP_VERSION_IHL = 0x45               # version 4, 5 words: no options
IP_PROTO_UDP = 17
DSCP_SHIFT = 2                      # TOS = DSCP << 2 | ECN
ECN_MASK = 0b11
ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = 0b00, 0b01, 0b10, 0b11

# -- UDP --------------------------------------------------------------------------------
UDP_BYTES = 8
UDP_AT = IP_AT + IPV4_BYTES
UDP_DPORT_AT = UDP_AT + 2
UDP_LEN_AT = UDP_AT + 4
UDP_CSUM_AT = UDP_AT + 6
ROCE_UDP_PORT = 4791                # IANA: RoCEv2, and the testbed's UET-style flows

# -- BTH and the extension headers ------------------------------------------------------
BTH_BYTES = 12
BTH_AT = UDP_AT + UDP_BYTES
BTH_OPCODE_AT = BTH_AT
BTH_RESV8A_AT = BTH_AT + 4          # FECN, BECN, reserved (1s in the ICRC)
BTH_DQPN_AT = BTH_AT + 5            # 24 bits
PSN_IN_BTH = 8                      # the PSN word from the BTH's start
BTH_PSN_AT = BTH_AT + PSN_IN_BTH    # ackreq (bit 31) | 7 reserved | PSN (24 bits)
ACKREQ_BIT = 1 << 31
PSN_MASK = 0xFFFFFF                 # PSNs are 24 bits and wrap
QPN_MASK = 0xFFFFFF
UET_QPN_FLAG = 1 << 23              # dQPN with bit 23 set: a UET-style (spray-tolerant) flow
UET_QPN_FLAG_BYTE = UET_QPN_FLAG >> 16   # that bit in the dQPN's first byte
RETH_BYTES, AETH_BYTES, SACK_BYTES = 16, 4, 12
ICRC_BYTES = 4
PSEUDO_LRH = b"\xff" * 8            # stands for the InfiniBand LRH in the ICRC
STAMP = struct.Struct(">QII")       # the testbed's stamp: send time ns, message id, offset
STAMP_BYTES = STAMP.size


class Opcode(IntEnum):
    """BTH opcodes (IBA 9.2: transport in the top 3 bits; 0x00 = Reliable Connection)."""

    RC_SEND_FIRST = 0x00
    RC_SEND_MIDDLE = 0x01
    RC_SEND_LAST = 0x02
    RC_SEND_ONLY = 0x04
    RC_RDMA_WRITE_FIRST = 0x06
    RC_RDMA_WRITE_MIDDLE = 0x07
    RC_RDMA_WRITE_LAST = 0x08
    RC_RDMA_WRITE_ONLY = 0x0A
    RC_ACK = 0x11
    CNP = 0x81


DATA_OPCODE_MAX = max(o for o in Opcode if o < Opcode.RC_ACK)   # 0x0a: SEND, RDMA WRITE
RETH_OPCODES = frozenset({Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_ONLY})
AETH_OPCODES = frozenset({Opcode.RC_ACK})


class Syndrome(IntEnum):
    """AETH syndrome (IBA 9.7.5.2.1): 3-bit kind, 5-bit credit count / NAK code."""

    ACK = 0x1F                  # ACK, credit count "invalid" (end-to-end credits off)
    RNR_NAK = 0x20              # receiver not ready (low 5 bits: timer)
    NAK_PSN_SEQ_ERROR = 0x60    # out of sequence: the sender goes back N
    NAK_INVALID_REQUEST = 0x61
    NAK_REMOTE_ACCESS = 0x62
    NAK_REMOTE_OPERATION = 0x63


# -- the trimmed frame (fabric.trimming) ------------------------------------------------
TRIM_DSCP = 46                      # trimmed frames on the wire (EF: a capture filters on it)
TRIMMED_UDP_PAYLOAD = BTH_BYTES + STAMP_BYTES                                  # 28 B
TRIMMED_FRAME_BYTES = ETH_BYTES + IPV4_BYTES + UDP_BYTES + TRIMMED_UDP_PAYLOAD  # 70 B

# -- PFC (802.1Qbb) ---------------------------------------------------------------------
PFC_DST_MAC = "01:80:c2:00:00:01"
OPCODE_PFC = 0x0101
QUANTUM_BITS = 512                  # one pause quantum = 512 bit times at the link rate
MAX_QUANTA = 0xFFFF
PFC_PRIORITIES = range(8)
PFC_FIELDS = struct.Struct("!6s6sHHH8H")   # dst, src, type, opcode, vector, c0 .. c7
PFC_HEADER_BYTES = PFC_FIELDS.size         # up to c7's pause time: 34
PFC_FRAME_BYTES = 60                       # the minimum Ethernet frame, without its FCS


def check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def mac_bytes(mac: str) -> bytes:
    """'02:00:00:00:00:0a' as its 6 bytes."""
    out = bytes.fromhex(mac.replace(":", ""))
    if len(out) != 6:
        raise ValueError(f"MAC address must be 6 bytes, got {mac!r}")
    return out


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def pfc_frame(src_mac: str, pause: dict[int, int]) -> bytes:
    """A PFC frame pausing priority p for pause[p] quanta (0 = resume)."""
    vector, quanta = 0, [0] * len(PFC_PRIORITIES)
    for prio, q in pause.items():
        check_range("priority", prio, 0, 7)
        check_range("pause quanta", q, 0, MAX_QUANTA)
        vector |= 1 << prio
        quanta[prio] = q
    head = PFC_FIELDS.pack(mac_bytes(PFC_DST_MAC), mac_bytes(src_mac), ETHERTYPE_MAC_CONTROL,
                           OPCODE_PFC, vector, *quanta)
    return head + bytes(PFC_FRAME_BYTES - len(head))


def parse_pfc_frame(frame: bytes | bytearray) -> dict | None:
    """src, enable_vector and pause_quanta (eight, c0 first) of a PFC frame; None if the
    frame is not one (another destination, ethertype or MAC control opcode, or short)."""
    if len(frame) < PFC_HEADER_BYTES:
        return None
    dst, src, etype, opcode, vector, *quanta = PFC_FIELDS.unpack_from(frame)
    if (dst != mac_bytes(PFC_DST_MAC) or etype != ETHERTYPE_MAC_CONTROL
            or opcode != OPCODE_PFC):
        return None
    return {"src": mac_text(src), "enable_vector": vector, "pause_quanta": quanta}


def pause_quanta(frame: bytes | bytearray, priority: int) -> int | None:
    """The pause quanta a PFC frame gives `priority` (0: resume), None if it is not a PFC
    frame or does not name that priority (one unpack: a receiver's hot path)."""
    if len(frame) < PFC_HEADER_BYTES:
        return None
    _, _, etype, opcode, vector, *quanta = PFC_FIELDS.unpack_from(frame)
    if etype != ETHERTYPE_MAC_CONTROL or opcode != OPCODE_PFC or not vector >> priority & 1:
        return None
    return quanta[priority]


def quanta_s(quanta: int, rate_mbps: float) -> float:
    """How long `quanta` pause quanta last on a link of `rate_mbps`."""
    return quanta * QUANTUM_BITS / (rate_mbps * 1e6)


# -- the VOQ control frame (per-destination pause, credit grant) -------------------------
VOQ_DST_MAC = PFC_DST_MAC           # link-local MAC-control group: a bridge never forwards it
VOQ_ETHERTYPE = 0x88B6              # IEEE 802 local experimental ethertype 2
VOQ_VERSION = 1
VOQ_FIELDS = struct.Struct("!6s6sHBBBx4sHxxII")   # dst, src, type, version, opcode, priority,
#                                                   dst IPv4, quanta, credit bytes, seq
VOQ_HEADER_BYTES = VOQ_FIELDS.size  # up to the sequence number: 34
VOQ_FRAME_BYTES = 60                # the minimum Ethernet frame, without its FCS
MAX_CREDIT_BYTES = MAX_SEQ = 0xFFFFFFFF
VOQ_DISSECTOR = Path(__file__).resolve().parent / "wireshark" / "aft_voq.lua"


class VoqOpcode(IntEnum):
    """What a VOQ control frame asks of the port that receives it."""

    PAUSE = 1       # hold the queue towards dst_ip for `quanta` (0: release it)
    CREDIT = 2      # the queue towards dst_ip may send `credit_bytes` a second from now


VOQ_OPCODES = frozenset(VoqOpcode)


@dataclass(frozen=True)
class VoqMessage:
    """One VOQ control frame, as `parse_voq_frame` reads it."""

    src_mac: str
    opcode: VoqOpcode
    priority: int
    dst_ip: str
    quanta: int
    credit_bytes: int
    seq: int

    @property
    def release(self) -> bool:
        """A pause of 0 quanta: the queue towards dst_ip may send again."""
        return self.opcode == VoqOpcode.PAUSE and self.quanta == 0


def voq_frame(src_mac: str, dst_ip: str, priority: int, quanta: int = 0,
              opcode: VoqOpcode = VoqOpcode.PAUSE, credit_bytes: int = 0,
              seq: int = 0) -> bytes:
    """A VOQ control frame from the port `src_mac`: a pause of the queue towards `dst_ip` in
    the class of 802.1p `priority` for `quanta` (0: release), or a credit grant of
    `credit_bytes` a second to it until the next grant. 60 bytes, without the FCS."""
    try:
        dst = ipaddress.IPv4Address(dst_ip).packed
    except ValueError:
        raise ValueError(f"dst_ip must be an IPv4 address, got {dst_ip!r}") from None
    if opcode not in VOQ_OPCODES:
        raise ValueError(f"opcode must be one of {[int(o) for o in VoqOpcode]}, got {opcode}")
    check_range("priority", priority, 0, 7)
    check_range("quanta", quanta, 0, MAX_QUANTA)
    check_range("credit_bytes", credit_bytes, 0, MAX_CREDIT_BYTES)
    check_range("seq", seq, 0, MAX_SEQ)
    if opcode == VoqOpcode.PAUSE and credit_bytes:
        raise ValueError(f"credit_bytes must be 0 in a pause, got {credit_bytes}")
    if opcode == VoqOpcode.CREDIT and quanta:
        raise ValueError(f"quanta must be 0 in a credit grant, got {quanta}")
    head = VOQ_FIELDS.pack(mac_bytes(VOQ_DST_MAC), mac_bytes(src_mac), VOQ_ETHERTYPE,
                           VOQ_VERSION, opcode, priority, dst, quanta, credit_bytes, seq)
    return head + bytes(VOQ_FRAME_BYTES - len(head))


def parse_voq_frame(frame: bytes | bytearray) -> VoqMessage | None:
    """The message of a VOQ control frame; None if the frame is not a version-1 one (another
    destination or ethertype, another version, an unknown opcode, a priority above 7, or
    short). The reserved fields are not read."""
    if len(frame) < VOQ_HEADER_BYTES:
        return None
    dst, src, etype, version, opcode, prio, dst_ip, quanta, credit, seq = \
        VOQ_FIELDS.unpack_from(frame)
    if (dst != mac_bytes(VOQ_DST_MAC) or etype != VOQ_ETHERTYPE or version != VOQ_VERSION
            or opcode not in VOQ_OPCODES or prio not in PFC_PRIORITIES):
        return None
    return VoqMessage(src_mac=mac_text(src), opcode=VoqOpcode(opcode), priority=prio,
                      dst_ip=str(ipaddress.IPv4Address(dst_ip)), quanta=quanta,
                      credit_bytes=credit, seq=seq)


def tshark_lua_args() -> list[str]:
    """The tshark arguments that load the VOQ frame's dissector (aft_voq.*)."""
    return ["-X", f"lua_script:{VOQ_DISSECTOR}"]


# -- the counters the eBPF programs share (one map of these, fabric.queue_counters) ------
class Count(ctypes.Structure):
    """`struct count` of fabric/bpf/wire.h: one entry of the counters' map."""

    _fields_ = [("bytes", ctypes.c_uint64), ("frames", ctypes.c_uint64)]


COUNT = struct.Struct("=QQ")        # Count as bytes: bytes, frames

# -- fabric/bpf/wire.h ------------------------------------------------------------------
C_DEFINES = {                       # name -> its comment in the header
    "ETH_BYTES": "", "ETH_TYPE_AT": "the ethertype, from the frame's start",
    "ETHERTYPE_IPV4": "",
    "IPV4_BYTES": "no options", "IP_AT": "", "IP_TOS_AT": "DSCP << 2 | ECN",
    "IP_LEN_AT": "", "IP_PROTO_AT": "", "IP_CSUM_AT": "", "IP_DST_AT": "",
    "IP_VERSION_IHL": "", "IP_PROTO_UDP": "", "DSCP_SHIFT": "", "ECN_MASK": "",
    "UDP_BYTES": "", "UDP_AT": "", "UDP_DPORT_AT": "", "UDP_LEN_AT": "",
    "ROCE_UDP_PORT": "RoCEv2 and the UET-style flows",
    "BTH_BYTES": "", "BTH_AT": "", "BTH_OPCODE_AT": "", "BTH_DQPN_AT": "",
    "DATA_OPCODE_MAX": "RC data opcodes: SEND, RDMA WRITE",
    "UET_QPN_FLAG_BYTE": "dQPN bit 23, in the dQPN's first byte",
    "TRIM_DSCP": "", "TRIMMED_UDP_PAYLOAD": "BTH + the stamp",
    "TRIMMED_FRAME_BYTES": "",
}
C_HEX = {"ETHERTYPE_IPV4", "IP_VERSION_IHL", "ECN_MASK", "DATA_OPCODE_MAX", "UET_QPN_FLAG_BYTE"}
C_TYPES = {ctypes.c_uint64: "__u64", ctypes.c_uint32: "__u32"}


def c_header() -> str:
    """fabric/bpf/wire.h as this module lays it out (scripts/build_bpf.py writes it)."""
    lines = ["/* SPDX-License-Identifier: GPL-2.0 */",
             "/* Written by scripts/build_bpf.py from fabric/wire.py: edit that, not this.",
             " * Offsets are from the start of the Ethernet frame (IPv4 without options). */",
             "#ifndef AFT_WIRE_H", "#define AFT_WIRE_H", ""]
    for name, comment in C_DEFINES.items():
        value = globals()[name]
        text = f"{value:#0{6 if value > 0xFF else 4}x}" if name in C_HEX else str(value)
        define = f"#define {name} {text}"
        lines.append(f"{define:<34}/* {comment} */" if comment else define)
    lines += ["", "/* one entry of the counters' map (fabric.wire.Count) */", "struct count {"]
    lines += [f"\t{C_TYPES[ctype]} {name};" for name, ctype in Count._fields_]
    lines += ["};", "", "#endif", ""]
    return "\n".join(lines)
